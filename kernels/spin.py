"""A one-thread kernel that sleeps on the GPU, used by the timing harness's eager mode.

Enqueued before a timed region, it keeps the GPU busy while the host (about 49 µs per numba launch) enqueues the
launches being timed, so that host launch latency does not fall between the start event and the work.
"""

from __future__ import annotations

import warnings

from numba import cuda

from kernels.jit import kernel


@kernel
def _spin(iterations):
    for _ in range(iterations):
        cuda.nanosleep(1000)


def spin(microseconds: int, stream=0) -> None:
    """Enqueue a kernel that sleeps for about ``microseconds`` µs (1 µs `nanosleep` steps, PTX ISA §9.7.13.x
    "nanosleep": the sleep is approximate, bounded by [0, 2t]). Raises ValueError for a negative duration."""
    if microseconds < 0:
        raise ValueError(f"spin duration must be >= 0 µs, got {microseconds}")
    with warnings.catch_warnings():  # one thread is the point: silence numba's low-occupancy warning
        warnings.filterwarnings("ignore", message=".*Grid size 1 will likely result in GPU under-utilization")
        _spin[1, 1, stream](microseconds)
