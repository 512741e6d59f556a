"""Hopper warpgroup MMA helpers (sm_90a only): `wgmma.mma_async` with both operands in shared memory or A in
registers (`wgmma_m64nNk16_f32_f16_rs`), its shared-memory matrix descriptor, and the fences / group commits it
needs. Same pattern as the rest of kernels.ptx: a stub per instruction naming its PTX ISA section, an `@intrinsic` emitting `llvmlite.ir.InlineAsm`, and beside it
a CUDA-simulator form of the same semantics.

Instruction (PTX ISA §9.7.15.5 "wgmma.mma_async"):

    wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {d0..d(N/2-1)}, a-desc, b-desc, scale-d, 1, 1, 0, 0;

D[64 x N] (+)= A[64 x 16] · B[N x 16]^T, f16 operands read from shared memory through two 64-bit matrix descriptors,
f32 accumulators in registers, issued by a whole warpgroup (4 consecutive warps, 128 threads, warp index a multiple
of 4 apart). Both operands K-major (imm-trans-a = imm-trans-b = 0): A is row-major [m, k], B is [n, k] (a row-major
weight slice).

Accumulator fragment (§9.7.15.5.1.1.1 "Matrix Fragments for wgmma.mma_async.m64nNk16"): thread tw of the
warpgroup, warp w = tw // 32, lane l, g = l >> 2, t = l & 3, holds N/2 f32: for every n8 column block j,
d[4j], d[4j+1] = D[16w + g, 8j + 2t (+1)] and d[4j+2], d[4j+3] = D[16w + g + 8, 8j + 2t (+1)] -- per warp, N/8
consecutive mma.m16n8k16 C fragments.

Matrix descriptor (§9.7.15.5.1.2.2 "Matrix Descriptor Format"), 64 bits: bits 0-13 start address >> 4 (of the
shared-window address), 16-29 leading-dimension byte offset >> 4 (LBO), 32-45 stride-dimension byte offset >> 4
(SBO), 49-51 base offset (0 here: every start address used is aligned to the swizzle pattern's repeat in the
address bits 7..9), 62-63 swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte).

Shared-memory layout of a K-major operand (§9.7.15.5.1.2 "Shared Memory Matrix Layout"), the byte address of
element (row r, k) relative to the descriptor's start address S:

* no swizzle: core matrices of 8 rows x 16 bytes, stored contiguously (128 B):
  ``S + (r // 8) * SBO + (r % 8) * 16 + (k // 8) * LBO + (k % 8) * 2``;
* swizzle of W = 32/64/128 bytes: rows of W bytes, 8-row groups SBO apart (LBO unused for k16 inside one row):
  ``a = S + (r // 8) * SBO + (r % 8) * W + 2k``, then the 16-byte chunk bits 4.. are XORed with the address bits
  7.. (``a ^= ((a >> 7) & (W / 16 - 1)) << 4``; CUTLASS's Swizzle<1|2|3, 4, 3>). The XOR acts on the absolute
  address, so a tile must start at a multiple of 8 * W bytes (the kernels declare their dynamic shared memory
  1024-byte aligned) and the k16 step inside a row is just ``S + 32 * kq``.

MN-major B (the register-A form's ``trans_b`` = 1, imm-trans-b): element (n, k) stored along n, which makes a
row-major [k, n] tile B without a transpose. Modelled for the 128-byte swizzle: CUTLASS's canonical
``Swizzle<3,4,3> o ((8,8,m),(8,k)):((1,8,LBO),(64,SBO))`` in f16 elements (cute/atom/mma_traits_sm90_gmma.hpp,
make_gmma_desc<Major::MN>): 64 consecutive n in one 128-byte row, such 64-n blocks LBO apart, k rows 128 bytes apart,
8-row k groups SBO apart, the same address XOR.

Ordering (§9.7.15.6-9): `wgmma_fence()` before the first wgmma of a batch (and after any other access to the
accumulator registers); `wgmma_commit_group()` closes a batch; `wgmma_wait_group(N)` waits until at most N batches
are pending (accumulators may be read, and the shared tiles of the finished batches reused, only after it).
Shared memory written through the generic proxy (st.shared, cp.async) must be made visible to wgmma's async proxy
with `fence_proxy_async_shared()` (§9.7.13.4.17 "membar/fence", .proxy.async) before the barrier that publishes it.

Simulator forms: the 128 threads of a warpgroup rendezvous (as kernels/ptx/_base.py's warp exchange, one barrier of
128 parties per simulated warpgroup); the last to arrive decodes both descriptors against the shared array with the
layout rules above (so a wrong LBO/SBO/swizzle gives wrong numbers there too), multiplies in float64 and hands each
thread its fragment. Fences, commits and waits are no-ops (the simulated wgmma is synchronous).
"""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR

if SIMULATOR:
    import threading

    import numpy as np

    from kernels.ptx._base import _BARRIER_TIMEOUT_S, _ndarray
else:
    from llvmlite import ir
    from numba.cuda.extending import _intrinsic, intrinsic

    from kernels.ptx._base import _asm, _check_1d_array, _check_scalars, _shared_u32

SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B = 0, 1, 2, 3
SWIZZLE_BYTES = {SWIZZLE_128B: 128, SWIZZLE_64B: 64, SWIZZLE_32B: 32}
WGMMA_N = tuple(range(8, 257, 8))  # the n values of m64nNk16 (§9.7.15.5 "Matrix shape")


def desc_value(address: int, lbo: int, sbo: int, swizzle: int) -> int:
    """The 64-bit descriptor of §9.7.15.5.1.2.2 as a Python int (host-side reference of `wgmma_desc`)."""
    return (((address & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
            | ((swizzle & 3) << 62))


def operand_byte_offsets(desc: int, rows: int, mn_major: bool = False):
    """Byte addresses (``rows`` x 16 int array) of the operand elements (r, k), k < 16, that descriptor ``desc``
    names; the K-major layout rules of the module docstring, or with ``mn_major`` the MN-major (transposed) layout
    of the 128-byte swizzle, CUTLASS's canonical ``Swizzle<3,4,3> o ((8,8,m),(8,k)):((1,8,LBO),(64,SBO))`` in f16
    elements: r's 64-element blocks LBO bytes apart, inside one a 128-byte row along r; k's rows 128 bytes apart,
    its 8-row groups SBO apart; the same XOR of address bits 4-6 with bits 7-9. Raises ValueError on a base offset or
    an MN-major operand without the 128-byte swizzle (neither modelled)."""
    import numpy as np

    desc = int(desc)
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    base_offset = (desc >> 49) & 7
    mode = (desc >> 62) & 3
    if base_offset:
        raise ValueError(f"wgmma descriptor base offset {base_offset} is not modelled by the simulator")
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    if mn_major:
        if mode != SWIZZLE_128B:
            raise ValueError("an MN-major wgmma operand is modelled with the 128-byte swizzle only")
        a = start + (r % 64) * 2 + (r // 64) * lbo + (k % 8) * 128 + (k // 8) * sbo
        return a ^ (((a >> 7) & 7) << 4)
    if mode == SWIZZLE_NONE:
        return start + (r // 8) * sbo + (r % 8) * 16 + (k // 8) * lbo + (k % 8) * 2
    width = SWIZZLE_BYTES[mode]
    a = start + (r // 8) * sbo + (r % 8) * width + k * 2
    return a ^ (((a >> 7) & (width // 16 - 1)) << 4)


# ---- matrix descriptor ----------------------------------------------------------------------------------------

if SIMULATOR:

    def wgmma_desc(smem, byte_offset, lbo, sbo, swizzle):
        """Simulator form of `wgmma_desc`: the start address is the byte offset into ``smem`` (the simulator has
        no shared window; the device array is 1024-byte aligned, so the swizzle phase is the same)."""
        return np.uint64(desc_value(int(byte_offset), int(lbo), int(sbo), int(swizzle)))

else:

    @intrinsic
    def wgmma_desc(typingctx, smem, byte_offset, lbo, sbo, swizzle):
        """The 64-bit wgmma shared-memory matrix descriptor (PTX ISA §9.7.15.5.1.2.2) of the operand starting
        ``byte_offset`` bytes into the 1-D shared array ``smem``: start = (shared-window address & 0x3FFFF) >> 4,
        LBO >> 4 in bits 16-29, SBO >> 4 in bits 32-45, base offset 0, ``swizzle`` (0 none, 1 128 B, 2 64 B,
        3 32 B) in bits 62-63. Returns uint64. Adding ``x >> 4`` to it moves the start by x bytes (no carry out
        of bits 0-13 while the address stays below 256 KB)."""
        _check_1d_array("wgmma_desc", smem, byte_offset)
        _check_scalars("wgmma_desc lbo, sbo, swizzle", (lbo, sbo, swizzle), types.Integer, 3)
        sig = types.uint64(smem, byte_offset, lbo, sbo, swizzle)

        def codegen(context, builder, sig, args):
            struct = context.make_array(sig.args[0])(context, builder, value=args[0])
            base = _shared_u32(builder, struct.data)
            i64 = ir.IntType(64)
            off = context.cast(builder, args[1], sig.args[1], types.uint32)
            addr = builder.zext(builder.add(base, off), i64)
            lbo_v, sbo_v, sw = (context.cast(builder, v, t, types.uint64) for v, t in zip(args[2:], sig.args[2:]))
            c = lambda x: ir.Constant(i64, x)  # noqa: E731
            d = builder.lshr(builder.and_(addr, c(0x3FFFF)), c(4))
            d = builder.or_(d, builder.shl(builder.and_(builder.lshr(lbo_v, c(4)), c(0x3FFF)), c(16)))
            d = builder.or_(d, builder.shl(builder.and_(builder.lshr(sbo_v, c(4)), c(0x3FFF)), c(32)))
            return builder.or_(d, builder.shl(builder.and_(sw, c(3)), c(62)))

        return sig, codegen


# ---- wgmma.mma_async ------------------------------------------------------------------------------------------

if SIMULATOR:
    _GROUPS_LOCK = threading.Lock()

    class _GroupExchange:
        """All-threads rendezvous of one simulated warpgroup (128 threads), as kernels/ptx/_base.py's
        _WarpExchange."""

        def __init__(self, parties: int) -> None:
            self.slots: list = [None] * parties
            self.op = None
            self.results: list = [None] * parties
            self.barrier = threading.Barrier(parties, action=self._compute, timeout=_BARRIER_TIMEOUT_S)

        def _compute(self) -> None:
            self.results = self.op(self.slots)

        def run(self, index: int, op, value):
            self.slots[index] = value
            self.op = op
            self.barrier.wait()
            return self.results[index]

    def _warpgroup_exchange(op, value):
        thread = threading.current_thread()
        manager = getattr(thread, "_manager", None)
        if manager is None:
            raise RuntimeError("warpgroup PTX fallbacks must be called from inside a simulated CUDA kernel")
        nthreads = int(np.prod(manager._block_dim))
        if thread.thread_id // 128 >= nthreads // 128:
            raise RuntimeError(f"wgmma needs whole warpgroups (128 threads); thread {thread.thread_id} is in a partial "
                               f"one of a {nthreads}-thread block")
        with _GROUPS_LOCK:
            groups = manager.__dict__.setdefault("_minfer_warpgroups", {})
            group = groups.get(thread.thread_id // 128)
            if group is None:
                group = groups[thread.thread_id // 128] = _GroupExchange(128)
        return group.run(thread.thread_id % 128, op, value)

    def _operand(smem, desc, rows, mn_major=False):
        flat = _ndarray(smem).reshape(-1).view(np.uint8)
        addr = operand_byte_offsets(desc, rows, mn_major)
        if addr.min() < 0 or addr.max() + 2 > flat.size:
            raise IndexError(f"wgmma descriptor {int(desc):#x} reads outside the shared array ({flat.size} bytes)")
        lo = flat[addr].astype(np.uint16)
        hi = flat[addr + 1].astype(np.uint16)
        return (lo | (hi << 8)).view(np.float16).astype(np.float64)

    def _wgmma_op(slots):
        smem, _, da, db, scale_d, n = slots[0]
        for s in slots:
            if (s[2], s[3], s[5]) != (da, db, n):
                raise RuntimeError("wgmma: the threads of a warpgroup passed different descriptors or shapes")
        return _wgmma_result(slots, _operand(smem, da, 64), _operand(smem, db, n), scale_d, n)

    def _a_from_registers(slots):
        """A [64 x 16] float64 from each thread's four f16x2 registers (the mma.m16n8k16 A fragment of its warp's
        16 rows: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); low half the lower k)."""
        a = np.zeros((64, 16), np.float64)
        for tw, s in enumerate(slots):
            w, lane = tw >> 5, tw & 31
            g, t = lane >> 2, lane & 3
            for i, word in enumerate(s[2]):
                r = 16 * w + g + 8 * (i & 1)
                k = 2 * t + 8 * (i >> 1)
                pair = np.array([int(word) & 0xFFFFFFFF], np.uint32).view(np.float16)
                a[r, k], a[r, k + 1] = float(pair[0]), float(pair[1])
        return a

    def _wgmma_rs_op(slots):
        smem, _, _, db, scale_d, n, trans_b = slots[0]
        for s in slots:
            if (s[3], s[5], s[6]) != (db, n, trans_b):
                raise RuntimeError("wgmma: the threads of a warpgroup passed different descriptors or shapes")
        return _wgmma_result(slots, _a_from_registers(slots), _operand(smem, db, n, bool(trans_b)), scale_d, n)

    def _wgmma_result(slots, a, b, scale_d, n):
        """Each thread's new accumulators: D = A · B^T (+ the C its registers hold when ``scale_d``)."""
        c = np.zeros((64, n), np.float64)
        if scale_d:
            for tw, s in enumerate(slots):
                w, lane = tw >> 5, tw & 31
                g, t = lane >> 2, lane & 3
                regs = s[1]
                for j in range(n // 8):
                    c[16 * w + g, 8 * j + 2 * t : 8 * j + 2 * t + 2] = regs[4 * j : 4 * j + 2]
                    c[16 * w + g + 8, 8 * j + 2 * t : 8 * j + 2 * t + 2] = regs[4 * j + 2 : 4 * j + 4]
        d = (a @ b.T + c).astype(np.float32)
        out = []
        for tw in range(128):
            w, lane = tw >> 5, tw & 31
            g, t = lane >> 2, lane & 3
            regs = []
            for j in range(n // 8):
                regs += [d[16 * w + g, 8 * j + 2 * t], d[16 * w + g, 8 * j + 2 * t + 1],
                         d[16 * w + g + 8, 8 * j + 2 * t], d[16 * w + g + 8, 8 * j + 2 * t + 1]]
            out.append(regs)
        return out

    def wgmma_m64nNk16_f32_f16(smem, acc, acc_base, desc_a, desc_b, scale_d, n):
        """Simulator form of `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16` (see the compiled form): the
        warpgroup's 128 threads rendezvous; acc[acc_base : acc_base + n/2] updated in place."""
        n = int(n)
        if n not in WGMMA_N:
            raise ValueError(f"wgmma m64nNk16: N must be a multiple of 8 in 8..256, got {n}")
        base = int(acc_base)
        regs = [float(acc[base + i]) for i in range(n // 2)]
        res = _warpgroup_exchange(_wgmma_op, (smem, regs, int(desc_a), int(desc_b), bool(scale_d), n))
        for i in range(n // 2):
            acc[base + i] = res[i]

    def wgmma_m64nNk16_f32_f16_rs(smem, acc, acc_base, a0, a1, a2, a3, desc_b, scale_d, n, trans_b):
        """Simulator form of the register-A `wgmma.mma_async` (see the compiled form): the warpgroup's 128 threads
        rendezvous with their A fragments; acc[acc_base : acc_base + n/2] updated in place."""
        n = int(n)
        if n not in WGMMA_N:
            raise ValueError(f"wgmma m64nNk16: N must be a multiple of 8 in 8..256, got {n}")
        base = int(acc_base)
        regs = [float(acc[base + i]) for i in range(n // 2)]
        words = (int(a0), int(a1), int(a2), int(a3))
        res = _warpgroup_exchange(_wgmma_rs_op, (smem, regs, words, int(desc_b), bool(scale_d), n, int(trans_b)))
        for i in range(n // 2):
            acc[base + i] = res[i]

else:

    @_intrinsic(target="cuda", prefer_literal=True)
    def wgmma_m64nNk16_f32_f16(typingctx, smem, acc, acc_base, desc_a, desc_b, scale_d, n):
        """`wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {d..}, a-desc, b-desc, p, 1, 1, 0, 0` (PTX ISA
        §9.7.15.5 "wgmma.mma_async"): D[64 x n] = A[64 x 16] · B[n x 16]^T (+ D when ``scale_d`` != 0), both
        operands K-major in shared memory (descriptors from `wgmma_desc`), issued by the whole warpgroup. The
        accumulators are the n/2 float32 ``acc[acc_base : acc_base + n/2]`` of a `cuda.local.array` (fragment
        layout in the module docstring), read and written in place ("+f"); with constant indices they live in
        registers. ``n`` must be a compile-time constant (8..256, multiple of 8). ``smem`` (the shared array the
        descriptors point into) is only read by the simulator. Asynchronous: follow with `wgmma_commit_group` and
        `wgmma_wait_group` before reading ``acc`` or overwriting the operands."""
        from numba.cuda.core.errors import NumbaTypeError

        _check_1d_array("wgmma_m64nNk16_f32_f16 smem", smem, acc_base)
        if not (isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.float32):
            raise NumbaTypeError(f"wgmma_m64nNk16_f32_f16 needs a 1-D float32 accumulator array, got {acc}")
        _check_scalars("wgmma_m64nNk16_f32_f16 descriptors, scale_d", (desc_a, desc_b, scale_d), types.Integer, 3)
        if not isinstance(n, types.IntegerLiteral) or int(n.literal_value) not in WGMMA_N:
            raise NumbaTypeError(f"wgmma_m64nNk16_f32_f16: n must be a compile-time multiple of 8 in 8..256, got {n}")
        nn = int(n.literal_value)
        regs = nn // 2
        sig = types.void(smem, acc, acc_base, desc_a, desc_b, scale_d, n)

        def codegen(context, builder, sig, args):
            struct = context.make_array(sig.args[1])(context, builder, value=args[1])
            base = context.cast(builder, args[2], sig.args[2], types.int64)
            ptrs = [builder.gep(struct.data, [builder.add(base, ir.Constant(ir.IntType(64), i))]) for i in range(regs)]
            accs = [builder.load(p) for p in ptrs]
            da = context.cast(builder, args[3], sig.args[3], types.uint64)
            db = context.cast(builder, args[4], sig.args[4], types.uint64)
            sd = context.cast(builder, args[5], sig.args[5], types.uint32)
            dlist = ", ".join(f"${i}" for i in range(regs))
            text = (
                "{ .reg .pred p; "
                f"setp.ne.b32 p, ${regs + 2}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{nn}k16.f32.f16.f16 {{{dlist}}}, ${regs}, ${regs + 1}, p, 1, 1, 0, 0; "
                "}"
            )
            cons = ",".join(["=f"] * regs + ["l", "l", "r"] + [str(i) for i in range(regs)] + ["~{memory}"])
            f32 = ir.FloatType()
            res = _asm(builder, ir.LiteralStructType([f32] * regs), [da, db, sd, *accs], text, cons, True)
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
            return context.get_dummy_value()

        return sig, codegen


    @_intrinsic(target="cuda", prefer_literal=True)
    def wgmma_m64nNk16_f32_f16_rs(typingctx, smem, acc, acc_base, a0, a1, a2, a3, desc_b, scale_d, n, trans_b):
        """`wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {d..}, {a0, a1, a2, a3}, b-desc, p, 1, 1, trans_b`
        (PTX ISA §9.7.15.5, the register-A form): D[64 x n] = A[64 x 16] · B[n x 16]^T (+ D when ``scale_d`` != 0),
        A from the warpgroup's registers, B in shared memory (descriptor from `wgmma_desc`): K-major with
        ``trans_b`` 0, MN-major with 1 (element (n, k) stored along n: `operand_byte_offsets`' mn_major layout, so a
        row-major [k, n] tile such as attention's V is B without a transpose; compile-time 0 or 1). Each warp holds its
        16 rows of A as the mma.m16n8k16 A fragment (§9.7.15.5.1.1 "Register Fragments"; lane l, g = l >> 2,
        t = l & 3: a0 = A[g, 2t..2t+1], a1 = A[g+8, 2t..], a2 = A[g, 2t+8..], a3 = A[g+8, 2t+8..], f16x2 uint32
        words, low half the lower k), so a C fragment of a previous product, packed to f16 in pairs, is an A
        fragment (FlashAttention's P·V). Accumulators, ``n``, ``smem`` and ordering as `wgmma_m64nNk16_f32_f16`;
        the A registers may be reused once the batch is waited for."""
        from numba.cuda.core.errors import NumbaTypeError

        _check_1d_array("wgmma_m64nNk16_f32_f16_rs smem", smem, acc_base)
        if not (isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.float32):
            raise NumbaTypeError(f"wgmma_m64nNk16_f32_f16_rs needs a 1-D float32 accumulator array, got {acc}")
        _check_scalars("wgmma_m64nNk16_f32_f16_rs a0..a3, descriptor, scale_d", (a0, a1, a2, a3, desc_b, scale_d),
                       types.Integer, 6)
        if not isinstance(n, types.IntegerLiteral) or int(n.literal_value) not in WGMMA_N:
            raise NumbaTypeError(f"wgmma_m64nNk16_f32_f16_rs: n must be a compile-time multiple of 8 in 8..256, got {n}")
        if not isinstance(trans_b, types.IntegerLiteral) or int(trans_b.literal_value) not in (0, 1):
            raise NumbaTypeError(f"wgmma_m64nNk16_f32_f16_rs: trans_b must be a compile-time 0 or 1, got {trans_b}")
        nn = int(n.literal_value)
        tb = int(trans_b.literal_value)
        regs = nn // 2
        sig = types.void(smem, acc, acc_base, a0, a1, a2, a3, desc_b, scale_d, n, trans_b)

        def codegen(context, builder, sig, args):
            struct = context.make_array(sig.args[1])(context, builder, value=args[1])
            base = context.cast(builder, args[2], sig.args[2], types.int64)
            ptrs = [builder.gep(struct.data, [builder.add(base, ir.Constant(ir.IntType(64), i))]) for i in range(regs)]
            accs = [builder.load(p) for p in ptrs]
            words = [context.cast(builder, args[3 + i], sig.args[3 + i], types.uint32) for i in range(4)]
            db = context.cast(builder, args[7], sig.args[7], types.uint64)
            sd = context.cast(builder, args[8], sig.args[8], types.uint32)
            dlist = ", ".join(f"${i}" for i in range(regs))
            alist = ", ".join(f"${regs + i}" for i in range(4))
            text = (
                "{ .reg .pred p; "
                f"setp.ne.b32 p, ${regs + 5}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{nn}k16.f32.f16.f16 {{{dlist}}}, {{{alist}}}, ${regs + 4}, p, 1, 1, {tb}; "
                "}"
            )
            cons = ",".join(["=f"] * regs + ["r", "r", "r", "r", "l", "r"] + [str(i) for i in range(regs)] + ["~{memory}"])
            f32 = ir.FloatType()
            res = _asm(builder, ir.LiteralStructType([f32] * regs), [*words, db, sd, *accs], text, cons, True)
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
            return context.get_dummy_value()

        return sig, codegen


# ---- ordering: fences, commit and wait of batches ---------------------------------------------------------------

if SIMULATOR:

    def wgmma_fence():
        """Simulator form of `wgmma.fence.sync.aligned` (nothing to order: the simulated wgmma is synchronous)."""

    def wgmma_commit_group():
        """Simulator form of `wgmma.commit_group.sync.aligned`."""

    def wgmma_wait_group(n):
        """Simulator form of `wgmma.wait_group.sync.aligned N`."""

    def fence_proxy_async_shared():
        """Simulator form of `fence.proxy.async.shared::cta` (there is one proxy here)."""

else:

    def _void_asm(text: str, doc: str):
        @intrinsic
        def impl(typingctx):
            sig = types.void()

            def codegen(context, builder, sig, args):
                _asm(builder, ir.VoidType(), [], text, "~{memory}", True)
                return context.get_dummy_value()

            return sig, codegen

        impl.__doc__ = doc
        return impl

    wgmma_fence = _void_asm("wgmma.fence.sync.aligned;", """`wgmma.fence.sync.aligned` (PTX ISA §9.7.15.6
        "wgmma.fence"): orders the warpgroup's earlier register and shared-memory accesses before the following
        wgmma.mma_async; needed before the first wgmma of each batch.""")
    wgmma_commit_group = _void_asm("wgmma.commit_group.sync.aligned;", """`wgmma.commit_group.sync.aligned` (PTX
        ISA §9.7.15.7 "wgmma.commit_group"): closes the batch of wgmma.mma_async issued since the last commit.""")
    fence_proxy_async_shared = _void_asm("fence.proxy.async.shared::cta;", """`fence.proxy.async.shared::cta`
        (PTX ISA §9.7.13.4.17 "membar/fence"): makes this thread's generic-proxy writes to shared memory (st.shared,
        completed cp.async) visible to the async proxy (wgmma operand reads); issue it before the barrier that
        publishes the tile.""")

    @_intrinsic(target="cuda", prefer_literal=True)
    def wgmma_wait_group(typingctx, n):
        """`wgmma.wait_group.sync.aligned N` (PTX ISA §9.7.15.8 "wgmma.wait_group"): wait until at most N committed
        wgmma batches of the warpgroup are pending. N must be a compile-time integer constant."""
        from numba.cuda.core.errors import NumbaTypeError

        if not isinstance(n, types.IntegerLiteral):
            raise NumbaTypeError(f"wgmma_wait_group needs a compile-time integer constant, got {n}")
        count = int(n.literal_value)
        if not 0 <= count <= 7:
            raise NumbaTypeError(f"wgmma_wait_group: N must be 0..7, got {count}")
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], f"wgmma.wait_group.sync.aligned {count};", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen
