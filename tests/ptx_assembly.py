"""Assemble PTX to a cubin without a GPU, through the nvJitLink that numba-cuda[cu13] installs (`cuda.bindings`):
the `compile` checks then know that ptxas accepts an inline-PTX instruction (operand types, state spaces, the
target's features), not only that NVVM pasted its text into the PTX."""

from __future__ import annotations


def assemble(ptx: str, arch: str = "sm_90a") -> bytes:
    """The cubin of ``ptx`` for ``arch`` (the ``.target`` line is set to it: numba writes ``sm_90`` for cc 9.0
    where the device build targets ``sm_90a``); AssertionError with nvJitLink's log when ptxas refuses it."""
    from cuda.bindings import nvjitlink

    text = "\n".join(f".target {arch}" if line.startswith(".target ") else line for line in ptx.splitlines())
    data = text.encode()
    handle = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
            nvjitlink.complete(handle)
        except Exception as exc:
            log = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, log)
            raise AssertionError(f"ptxas refused the PTX for {arch}: {log.decode(errors='replace').strip()}") from exc
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)
