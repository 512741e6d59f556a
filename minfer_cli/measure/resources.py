"""Resource figures of compiled kernels, read from numba's compiled objects (registers, shared and local memory,
occupancy) and from ptxas's own report on their PTX (whether it serialized their wgmma): what `minfer kernels`
prints and `baselines/` snapshots."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from minfer_cli.experiment import KernelInstance


@dataclass(frozen=True)
class KernelResources:
    """regs: registers per thread; static_smem / dynamic_smem: bytes per block; local_mem: bytes per thread of
    local memory (stack frame and spills: anything above 0 is a spill to DRAM-backed memory); blocks_per_sm: the
    most resident blocks per SM at this launch shape; wgmma: "" for a kernel without wgmma, "async", or
    "serialized (C75xx)" when ptxas serializes its wgmma (`wgmma_state`), or "whole-program (not inspected)" for
    a kernel the driver's JIT compiled (`kernels.jit.load_whole_program`: nvJitLink's relocatable report would not
    be its)."""

    name: str
    threads: int
    regs: int
    static_smem: int
    dynamic_smem: int
    local_mem: int
    blocks_per_sm: int
    wgmma: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


_SERIALIZED = re.compile(r"\((C\d+)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized")


def assemble_ptx(ptx: str, arch: str | None = None, verbose: bool = True) -> tuple[bytes, str]:
    """(cubin, ptxas's report) of ``ptx``, assembled through nvJitLink (`cuda.bindings`, which numba-cuda installs;
    no GPU needed); with ``verbose`` the report is ptxas's ``-v`` (registers, spills, stack, performance warnings).
    ``arch`` (e.g. "sm_90a") replaces the PTX's ``.target`` line; None keeps it. Raises RuntimeError with ptxas's
    message when it refuses the PTX."""
    from cuda.bindings import nvjitlink

    if arch is None:
        found = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M)
        arch = found.group(1) if found else "sm_90a"
    else:
        ptx = "\n".join(f".target {arch}" if line.startswith(".target ") else line for line in ptx.splitlines())
    data = ptx.encode()
    options = [f"-arch={arch}"] + (["-verbose", "-Xptxas=-v"] if verbose else [])
    handle = nvjitlink.create(len(options), options)
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
            nvjitlink.complete(handle)
        except Exception as exc:
            log = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, log)
            raise RuntimeError(f"ptxas refused the PTX for {arch}: {log.decode(errors='replace').strip()}") from exc
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
        return bytes(cubin), log.decode(errors="replace")
    finally:
        nvjitlink.destroy(handle)


def wgmma_state(ptx: str, log: str) -> str:
    """The empty string when ``ptx`` issues no wgmma; else "serialized (C75xx)" when ptxas's ``log``
    (`assemble_ptx`) says it
    serialized the wgmma (it then waits for each one before the next: a subroutine call in the kernel, such as a
    64-bit integer or IEEE float division, or other instructions writing a wgmma's registers inside its pipeline
    stage), or "async"."""
    if "wgmma.mma_async" not in ptx:
        return ""
    found = _SERIALIZED.search(log)
    return f"serialized ({found.group(1)})" if found else "async"


def resources(instance: KernelInstance) -> KernelResources:
    """Read the figures of a compiled instance on the current device (needs a GPU)."""
    from numba import cuda, types

    d = instance.dispatcher
    given = instance.signature
    sig = given if hasattr(given, "args") else types.void(*given)  # the getters look the overload up by `sig.args`
    kernel = d.overloads[sig.args]
    sm_count = cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks = kernel.max_cooperative_grid_blocks(instance.threads, instance.dynamic_smem) // sm_count
    return KernelResources(
        name=instance.name,
        threads=instance.threads,
        regs=int(d.get_regs_per_thread(sig)),
        static_smem=int(d.get_shared_mem_per_block(sig)),
        dynamic_smem=int(instance.dynamic_smem),
        local_mem=int(d.get_local_mem_per_thread(sig)),
        blocks_per_sm=int(blocks),
        wgmma=_wgmma_of(d, sig.args),
    )


def _wgmma_of(dispatcher, args) -> str:
    """`wgmma_state` of a compiled kernel's PTX (numba's `inspect_asm`, whose overloads are keyed by the argument
    types ``args``, not by a full signature), or "?" when ptxas cannot be asked."""
    from kernels.jit import is_whole_program

    ptx = dispatcher.inspect_asm(args)
    if "wgmma.mma_async" not in ptx:
        return ""
    if is_whole_program(dispatcher, args):
        return "whole-program (not inspected)"
    arch = "sm_90a" if re.search(r"^\.target\s+sm_90\b", ptx, re.M) else None  # wgmma needs the "a" target
    try:
        return wgmma_state(ptx, assemble_ptx(ptx, arch)[1])
    except (ImportError, RuntimeError):
        return "?"
