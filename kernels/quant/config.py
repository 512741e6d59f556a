"""The dequantization launcher's threads-per-block choices (`kernels.quant.dequant`), in a module without numba so
that the dequant experiment's knob table (`minfer experiments list`) reads them without importing the kernels.
`kernels.quant.dequant` imports them from here.
"""

from __future__ import annotations

TPB_VALUES = (64, 128, 256, 512, 1024)
DEFAULT_TPB = 256
