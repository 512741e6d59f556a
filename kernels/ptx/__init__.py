"""Inline-PTX helpers for numba.cuda kernels, one module per instruction family, each helper's CUDA-simulator form
beside its compiled form.

Pattern (numba-cuda's own `cache_hints.py`): a plain stub whose docstring names the instruction and its PTX ISA
section, an `@intrinsic` that validates its argument types at typing time and emits `llvmlite.ir.InlineAsm`,
multi-result instructions returned through a `LiteralStructType` and `extract_value`.

Under `NUMBA_ENABLE_CUDASIM=1` (read once, at import) kernels run as Python: each helper is then a Python
function computing exactly what the instruction computes, per lane.

Modules:
    _base       the SIMULATOR flag, argument checks, codegen helpers, the simulator's per-warp rendezvous
    memory      vector loads / stores (global, shared; f32 ones for a staged C tile), shared-window addresses, opaque_u32, L2 prefetch
    async_copy  cp.async (16-byte, index and byte-offset forms), commit / wait groups, CP_ASYNC_POISON
    bulk        Hopper bulk copies (cp.async.bulk) completing on mbarriers (init, arrive, expect-tx, try_wait.parity),
                setmaxnreg, BULK_POISON
    mma         mma.sync m16n8k16, ldmatrix (x4, .trans, byte-offset), .f16x2 pack / unpack
    wmma        wmma m16n16k16 load / mma / store
    tma         Hopper tensor-map tile copies (cp.async.bulk.tensor.2d, 128-byte swizzle) and their host-side maps
    wgmma       Hopper warpgroup MMA (sm_90a): wgmma.mma_async, matrix descriptors, fences, commit / wait
    sync        bar.warp.sync, named barrier.sync, shfl.sync.bfly, griddepcontrol (programmatic dependent launch), pdl_enter,
                red.release / ld.acquire at GPU scope (grid barriers)
    arith       dp4a, prmt, sub / fma .f16x2

Every helper is importable from here (``from kernels.ptx import ldmatrix_x4``).

Source: PTX ISA 9.x (https://docs.nvidia.com/cuda/parallel-thread-execution/).
"""

from __future__ import annotations

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars
from kernels.ptx.arith import div_approx_f32, dp4a_s32, fma_f16x2, prmt_b32, sub_f16x2
from kernels.ptx.async_copy import (
    CP_ASYNC_POISON,
    cp_async_16,
    cp_async_16_off,
    cp_async_commit_group,
    cp_async_wait_group,
)
from kernels.ptx.bulk import (
    BULK_POISON,
    cp_async_bulk_g2s,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait_parity,
    setmaxnreg_dec,
    setmaxnreg_inc,
)
from kernels.ptx.memory import (
    ld_global_v2_b32,
    ld_global_v4_f32,
    ld_global_v4_b32,
    ld_global_v4_u32,
    ld_shared_v4_b32,
    ld_shared_v4_f32,
    opaque_u32,
    prefetch_l2,
    prefetch_l2_bulk,
    shared_addr,
    st_global_v4_f32,
    st_global_v4_u32,
    st_shared_v2_f32,
    st_shared_v4_b32,
)
from kernels.ptx.mma import (
    ldmatrix_x4,
    ldmatrix_x4_off,
    ldmatrix_x4_trans,
    mma_m16n8k16_f32_f16,
    pack_f16x2,
    unpack_f16x2,
)
from kernels.ptx.sync import (
    bar_sync,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    ld_acquire_gpu,
    pdl_enter,
    red_release_gpu_add,
    shfl_xor_f32,
    syncwarp,
)
from kernels.ptx.tma import BOX_COLS, MAP_WORDS, cp_async_bulk_tensor_2d_g2s, tensor_map_2d, tensor_map_bytes_2d
from kernels.ptx.wgmma import (
    SWIZZLE_32B,
    SWIZZLE_64B,
    SWIZZLE_128B,
    SWIZZLE_BYTES,
    SWIZZLE_NONE,
    WGMMA_N,
    desc_value,
    fence_proxy_async_shared,
    operand_byte_offsets,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_m64nNk16_f32_f16,
    wgmma_m64nNk16_f32_f16_rs,
    wgmma_wait_group,
)
from kernels.ptx.wmma import (
    wmma_load_a_f16,
    wmma_load_b_f16,
    wmma_mma_f32_f16,
    wmma_store_d_f32_global,
    wmma_store_d_f32_shared,
)

# Private names other modules import from `kernels.ptx` (the simulator's warp rendezvous for kernels that emulate
# shuffles, the numpy view of a simulated array for tests; the codegen helpers for intrinsics kept outside).
if SIMULATOR:
    from kernels.ptx._base import _BARRIER_TIMEOUT_S, _ndarray, _warp_exchange
else:
    from kernels.ptx._base import _asm, _shared_u32

__all__ = [
    "BOX_COLS",
    "BULK_POISON",
    "CP_ASYNC_POISON",
    "MAP_WORDS",
    "SIMULATOR",
    "SWIZZLE_128B",
    "SWIZZLE_32B",
    "SWIZZLE_64B",
    "SWIZZLE_BYTES",
    "SWIZZLE_NONE",
    "WGMMA_N",
    "bar_sync",
    "cp_async_16",
    "cp_async_16_off",
    "cp_async_bulk_g2s",
    "cp_async_bulk_tensor_2d_g2s",
    "cp_async_commit_group",
    "cp_async_wait_group",
    "desc_value",
    "div_approx_f32",
    "dp4a_s32",
    "fence_proxy_async_shared",
    "fma_f16x2",
    "griddepcontrol_launch_dependents",
    "griddepcontrol_wait",
    "ld_global_v2_b32",
    "ld_global_v4_f32",
    "ld_global_v4_b32",
    "ld_global_v4_u32",
    "ld_shared_v4_b32",
    "ld_shared_v4_f32",
    "ldmatrix_x4",
    "ldmatrix_x4_off",
    "ldmatrix_x4_trans",
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_init",
    "mbarrier_try_wait_parity",
    "mma_m16n8k16_f32_f16",
    "operand_byte_offsets",
    "opaque_u32",
    "pack_f16x2",
    "pdl_enter",
    "prefetch_l2",
    "prmt_b32",
    "prefetch_l2_bulk",
    "setmaxnreg_dec",
    "setmaxnreg_inc",
    "shared_addr",
    "shfl_xor_f32",
    "st_global_v4_f32",
    "st_global_v4_u32",
    "st_shared_v2_f32",
    "st_shared_v4_b32",
    "sub_f16x2",
    "syncwarp",
    "tensor_map_2d",
    "tensor_map_bytes_2d",
    "unpack_f16x2",
    "wgmma_commit_group",
    "wgmma_desc",
    "wgmma_fence",
    "wgmma_m64nNk16_f32_f16",
    "wgmma_m64nNk16_f32_f16_rs",
    "wgmma_wait_group",
    "wmma_load_a_f16",
    "wmma_load_b_f16",
    "wmma_mma_f32_f16",
    "wmma_store_d_f32_global",
    "wmma_store_d_f32_shared",
]
