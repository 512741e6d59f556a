"""Resource figures of compiled kernels, read from numba's compiled objects (registers, shared and local memory,
occupancy): what `minfer kernels` prints and `baselines/` snapshots."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minfer_cli.experiment import KernelInstance


@dataclass(frozen=True)
class KernelResources:
    """regs: registers per thread; static_smem / dynamic_smem: bytes per block; local_mem: bytes per thread of
    local memory (stack frame and spills: anything above 0 is a spill to DRAM-backed memory); blocks_per_sm: the
    most resident blocks per SM at this launch shape."""

    name: str
    threads: int
    regs: int
    static_smem: int
    dynamic_smem: int
    local_mem: int
    blocks_per_sm: int

    def as_dict(self) -> dict:
        return asdict(self)


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
    )
