"""Decode bookkeeping on the device: record the token just chosen and move to the next position.

One decode step reads its token id, position and attention length from device memory (``state = [id, pos,
length]``, int32), so a single captured CUDA graph serves every step. After the step's argmax has written the
next token into ``state[0]``, `advance` (one thread) does::

    history[state[1]] = state[0]        # the token generated at this position (it will sit at position pos + 1)
    state[1] += 1                       # position of the next step
    state[2] = state[1] + 1             # keys the next step attends to (positions 0..pos, itself included)

The engine refuses (on the host) to run a step whose position is past the KV cache; this kernel does not check.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.jit import kernel

ID, POS, LENGTH = 0, 1, 2
STATE_SIZE = 3


@kernel
def _advance(state, history):
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        p = state[POS]
        history[p] = state[ID]
        state[POS] = p + 1
        state[LENGTH] = p + 2


def advance(state, history, stream=0) -> None:
    """Enqueue ``history[pos] = id; pos += 1; length = pos + 1`` on ``stream`` (``state = [id, pos, length]``).

    state: C-contiguous int32 device array of STATE_SIZE elements; history: C-contiguous 1-D int32 device array
    (one slot per position; 0 <= pos < history.size is the caller's contract, not checked on the device).
    Raises KernelConstraintError for wrong dtypes, shapes or layouts.
    """
    for name, a, size in (("state", state, STATE_SIZE), ("history", history, None)):
        if (not devicearray.is_cuda_ndarray(a) or a.dtype != np.int32 or a.ndim != 1 or not a.is_c_contiguous()
                or (size is not None and a.size != size)):
            raise KernelConstraintError(
                f"{name} must be a C-contiguous 1-D int32 device array{f' of {size} elements' if size else ''}, got "
                f"{getattr(a, 'dtype', type(a).__name__)} {tuple(getattr(a, 'shape', ()))}"
            )
    _advance[1, 32, stream](state, history)
