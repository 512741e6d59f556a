"""Launching a numba.cuda kernel with programmatic stream serialization (programmatic dependent launch, PDL).

An ordinary launch starts only after the previous kernel of its stream has completed: the SMs sit idle through that
kernel's tail (its last CUDA blocks), its completion and this kernel's launch and ramp-up. Launched with the
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` attribute, a kernel may start as soon as the previous one
allows it (`kernels.ptx.griddepcontrol_launch_dependents`, or that kernel's end): its CUDA blocks take the SM slots
the previous kernel's blocks leave, do work that depends on no earlier kernel, then wait in
`kernels.ptx.griddepcontrol_wait` until the previous kernel has completed and its writes are visible. A kernel
launched this way must call that wait before it touches anything an earlier kernel writes (or reads, for its own
writes). The attribute is recorded by stream capture (a programmatic edge in the CUDA graph).

numba-cuda 0.30 launches through ``cuda.core.launch`` with a ``LaunchConfig`` that it builds without the attribute;
`launch_kernel` does the same steps (``_Kernel.launch``: the compiled kernel of the arguments' types, its argument
packing) with ``programmatic_stream_serialization=True``. Source: CUDA Programming Guide, "Programmatic Dependent Launch and
Synchronization"; cuda.core ``LaunchConfig``.
"""

from __future__ import annotations

from kernels.ptx import SIMULATOR


def _compiled(dispatcher, args: tuple):
    """The compiled kernel numba would launch for ``args``: the overload of their types; else, for a dispatcher
    that can compile nothing more (built for one explicit signature, numba's own rule in ``_Kernel`` dispatch), its
    only overload; else None (not compiled yet for these types: the caller launches ordinarily so numba compiles).
    A lazily compiled dispatcher never lends another types' overload: the prefill's RMSNorm with f16 out would
    otherwise write f16 bits into the decode's f32 buffer."""
    from numba.cuda.typing.typeof import Purpose, typeof

    kernel = dispatcher.overloads.get(tuple(typeof(a, Purpose.argument) for a in args))
    if kernel is None and not dispatcher._can_compile and len(dispatcher.overloads) == 1:
        kernel = next(iter(dispatcher.overloads.values()))
    return kernel


def _dim(d):
    """A launch dimension as cuda.core takes it: an int or a tuple of ints (numba also takes lists and numpy
    integers)."""
    return int(d) if not isinstance(d, (tuple, list)) else tuple(int(x) for x in d)


def launch_kernel(dispatcher, grid, block, stream, args: tuple, *, pdl: bool, shmem: int = 0) -> None:
    """Enqueue ``dispatcher[grid, block, stream, shmem](*args)``; with ``pdl``, with programmatic stream
    serialization.

    dispatcher: a ``numba.cuda.jit`` kernel (with ``pdl``, its code must call `kernels.ptx.griddepcontrol_wait`
    before any access that depends on an earlier kernel); grid, block: launch shape (int or tuple); stream: a numba
    stream (not 0: the attribute orders this kernel after the previous one of the same stream); shmem: dynamic
    shared memory bytes. Under the CUDA simulator, or without ``pdl``, this is the ordinary launch; the first
    launch for new argument types is ordinary too (numba compiles the kernel there).

    Raises ValueError when ``pdl`` is set with the default stream (0) on the device.
    """
    if not pdl or SIMULATOR:
        dispatcher[grid, block, stream, shmem](*args)
        return
    if not stream:
        raise ValueError("a programmatic dependent launch needs a numba stream, not the default stream 0")
    from cuda.core import LaunchConfig
    from cuda.core import launch as core_launch

    kernel = _compiled(dispatcher, args)
    if kernel is None:  # first call with these types: compile through an ordinary launch
        dispatcher[grid, block, stream, shmem](*args)
        return
    packed, writeback = [], []
    for t, v in zip(kernel.argument_types, args):
        kernel._prepare_args(t, v, stream, writeback, packed)
    config = LaunchConfig(grid=_dim(grid), block=_dim(block), shmem_size=int(shmem),
                          programmatic_stream_serialization=True)
    core_launch(stream, config, kernel._codelibrary.get_cufunc().kernel, *packed)
    for copy_back in writeback:  # host arrays among the arguments: copied back as numba's own launch does
        copy_back()
