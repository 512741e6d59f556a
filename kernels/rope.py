"""Rotary position embedding (RoPE), in place on f32 q ``[nt, n_heads, head_dim]`` and k ``[nt, n_kv_heads, head_dim]``.

For token t at position ``p = pos[t]`` (a device int32 array, so decode reads its position from device memory)
and pair i (0 <= i < head_dim/2), with ``theta = p * base^(-2i/head_dim) / factor[i]``:

    x0' = x0 cos(theta) - x1 sin(theta),    x1' = x0 sin(theta) + x1 cos(theta)

where (x0, x1) = (x[i], x[i + head_dim/2]) in ``neox`` mode (qwen2; ggml's GGML_ROPE_TYPE_NEOX, HF's
``rotate_half``) and (x[2i], x[2i+1]) in ``norm`` mode (llama; ggml's mode 0, "normal"/interleaved). ``factor``
is the file's ``rope_freqs`` tensor (Llama 3.1+ frequency scaling: each pair's frequency divided by its factor,
as ggml's rope with ``freq_factors``), all ones for models without one.

Angles in float64, then sin/cos rounded to f32. In f32, ``theta`` itself carries an error of up to half an ulp of
theta (at p = 32768 and i = 1, theta ~ 26000 and ulp = 2^-9: up to 1e-3 rad), i.e. a relative error of ~1e-4 in
the rotated values, far above the 1e-5 an f32 kernel should meet (`tests/test_elementwise.py` demonstrates it;
llama.cpp and HF both compute theta in f32 and so carry that error; we agree with them to ~1e-4 at p = 32k and
to ~1e-7 at small p). Here theta = p * base^(-2i/d) in f64 (``pow`` in f64), reduced to r in [-pi/4, pi/4] with
a two-constant Cody-Waite step (fdlibm's pio2_1/pio2_1t: exact for quadrant numbers k < 2^20, i.e. theta < 1.6e6,
which covers any p < 1.6e6), and sin/cos of r by their Taylor series to degree 15/16 (truncation < 5e-17). We
do not call libdevice's ``sin``/``cos``: their large-argument (Payne-Hanek) path puts a local-memory array in
every kernel that calls them, f32 or f64. The f64 work is per (token, pair), done once by the threads of row
``threadIdx.y == 0`` into a shared (cos, sin) table and used for all the token's heads.

One CUDA block per token, threads ``(tx, ty)``: tx walks the pairs, ty the heads (q's then k's); in ``neox``
mode a warp's loads are 4-byte, consecutive (coalesced), in ``norm`` mode 8-byte pairs at consecutive addresses.
`rope_angles` computes the same (cos, sin) for every (token, pair) once into device memory, one thread each; a
`rope` given them (``angles``) reads its token's row instead of filling the shared table (a prefill's layers all
rotate the same positions).

Source: Su et al. 2021, "RoFormer" (arXiv:2104.09864); llama.cpp ``ggml/src/ggml-cuda/rope.cu``
(``rope_norm``/``rope_neox``); fdlibm ``e_rem_pio2.c`` (pio2_1, pio2_1t).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.launch import launch_kernel
from kernels.ptx import pdl_enter
from kernels.jit import kernel

MODES = ("neox", "norm")
THREADS = 1024
"""Threads per block: min(head_dim/2, 128) along the pairs times as many heads as fit (qwen2-7B: 64 x 16, two
heads per thread). With 256 threads a decode step's rope took 4.5 µs on the H200, with 1024 threads and every
thread computing its pairs' angles in f64 4.1 µs: the angles are now computed once per pair (a shared table)."""
MAX_HEAD_DIM = 1024
MAX_PAIRS = MAX_HEAD_DIM // 2
"""Rows of the per-block (cos, sin) table: head_dim up to 1024."""

TWO_OVER_PI = 6.36619772367581382433e-01
PIO2_1 = 1.57079632673412561417e00  # first 33 bits of pi/2: k * PIO2_1 is exact for k < 2^20
PIO2_1T = 6.07710050650619224932e-11  # pi/2 - PIO2_1
# Taylor coefficients: sin r = r + r^3 S3 + ... + r^15 S15; cos r = 1 + r^2 C2 + ... + r^16 C16.
S3, S5, S7, S9 = -1.0 / 6.0, 1.0 / 120.0, -1.0 / 5040.0, 1.0 / 362880.0
S11, S13, S15 = -1.0 / 39916800.0, 1.0 / 6227020800.0, -1.0 / 1307674368000.0
C2, C4, C6, C8 = -1.0 / 2.0, 1.0 / 24.0, -1.0 / 720.0, 1.0 / 40320.0
C10, C12, C14, C16 = -1.0 / 3628800.0, 1.0 / 479001600.0, -1.0 / 87178291200.0, 1.0 / 20922789888000.0


@cuda.jit(device=True, inline="always")
def sincos_f64(theta):
    """(sin theta, cos theta) in float64 for 0 <= |theta| < 1.6e6, without libdevice (no local memory)."""
    k = math.floor(theta * TWO_OVER_PI + 0.5)
    r = (theta - k * PIO2_1) - k * PIO2_1T
    r2 = r * r
    s = r + r * r2 * (S3 + r2 * (S5 + r2 * (S7 + r2 * (S9 + r2 * (S11 + r2 * (S13 + r2 * S15))))))
    c = 1.0 + r2 * (C2 + r2 * (C4 + r2 * (C6 + r2 * (C8 + r2 * (C10 + r2 * (C12 + r2 * (C14 + r2 * C16)))))))
    quadrant = int(k) & 3
    if quadrant == 0:
        return s, c
    if quadrant == 1:
        return c, -s
    if quadrant == 2:
        return -s, -c
    return -c, s


@cuda.jit(device=True, inline="always")
def _rotate(x, t, h, i0, i1, cs, sn, bias, b0):
    """Rotate pair (i0, i1) of head h of token t in place; with a ``bias`` (None: none) its values at b0 + i0 and
    b0 + i1 are added first (the f32 sums `kernels.residual.bias_add` would have stored)."""
    x0 = x[t, h, i0]
    x1 = x[t, h, i1]
    if bias is not None:
        x0 += bias[b0 + i0]
        x1 += bias[b0 + i1]
    x[t, h, i0] = x0 * cs - x1 * sn
    x[t, h, i1] = x0 * sn + x1 * cs


@cuda.jit(device=True, inline="always")
def _cos_sin(p, i, base, factors, hd):
    """(cos, sin) of pair i at position p (f64), rounded to f32: the one angle computation of every RoPE kernel."""
    theta = p * math.pow(base, float64(-2 * i) / float64(hd)) / float64(factors[i])
    s64, c64 = sincos_f64(theta)
    return float32(c64), float32(s64)


@cuda.jit(device=True, inline="always")
def _fill_table(table, p, base, factors, hd):
    """Row ``threadIdx.y == 0`` writes each pair's (cos, sin) at position p (f64) into the shared ``table``."""
    if cuda.threadIdx.y == 0:
        i = cuda.threadIdx.x
        while i < (hd >> 1):
            c, sn = _cos_sin(p, i, base, factors, hd)
            table[i, 0] = c
            table[i, 1] = sn
            i += cuda.blockDim.x
    cuda.syncthreads()


@kernel
def _angles(pos, base, factors, hd, out):
    """out[t, i] = (cos, sin) of pair i at position pos[t] (`_cos_sin`); one thread a (token, pair), grid-stride."""
    half = hd >> 1
    n = pos.shape[0] * half
    j = cuda.grid(1)
    while j < n:
        t = j // half
        i = j - t * half
        c, sn = _cos_sin(float64(pos[t]), i, base, factors, hd)
        out[t, i, 0] = c
        out[t, i, 1] = sn
        j += cuda.gridsize(1)


@cuda.jit(device=True, inline="always")
def _rotate_token(q, k, t, table, interleaved, k_cache, row, q_out, bias):
    """Rotate token t's q and k heads by the shared (cos, sin) ``table``: thread (x, y) takes pairs x, x + blockDim.x,
    ... of heads y, y + blockDim.y, ... (q's, then k's). With a ``k_cache`` (None: none), each rotated k pair is
    also stored (f32 -> f16, as `kernels.kv_cache.kv_append` copies) into cache row ``row``, read back after the
    rotation stored it; with a ``q_out`` (f16 [nt, nh * hd]; None: none), each rotated q pair into its row t. With a
    ``bias`` (f32 [nh * hd + 2 * nkv * hd], q|k|v; None: none), q and k get theirs before the rotation."""
    nh = q.shape[1]
    n_heads = nh + k.shape[1]
    hd = q.shape[2]
    half = hd >> 1
    i = cuda.threadIdx.x
    while i < half:
        cs = table[i, 0]
        sn = table[i, 1]
        if interleaved:
            i0 = 2 * i
            i1 = i0 + 1
        else:
            i0 = i
            i1 = i + half
        h = cuda.threadIdx.y
        while h < n_heads:
            if h < nh:
                _rotate(q, t, h, i0, i1, cs, sn, bias, h * hd)
                if q_out is not None:
                    q_out[t, h * hd + i0] = q[t, h, i0]
                    q_out[t, h * hd + i1] = q[t, h, i1]
            else:
                hk = h - nh
                _rotate(k, t, hk, i0, i1, cs, sn, bias, (nh + hk) * hd)
                if k_cache is not None:
                    k_cache[row, hk * hd + i0] = k[t, hk, i0]
                    k_cache[row, hk * hd + i1] = k[t, hk, i1]
            h += cuda.blockDim.y
        i += cuda.blockDim.x


@kernel
def _rope(q, k, pos, base, factors, interleaved):
    """Token blockIdx.x of q (f32 [nt, nh, hd]) and k (f32 [nt, nkv, hd]), in place; pos int32 [nt]; base f64;
    factors f32 [hd/2].
    The threads of row ``threadIdx.y == 0`` compute each pair's (cos, sin) once into shared memory; then every
    thread rotates its pairs in its heads."""
    pdl_enter()
    t = cuda.blockIdx.x
    table = cuda.shared.array((MAX_PAIRS, 2), float32)
    _fill_table(table, float64(pos[t]), base, factors, q.shape[2])
    _rotate_token(q, k, t, table, interleaved, None, 0, None, None)


@kernel
def _rope_tab(q, k, angles, interleaved):
    """`_rope` with every token's (cos, sin) read from ``angles`` (f32 [nt, hd/2, 2], `rope_angles`)."""
    pdl_enter()
    t = cuda.blockIdx.x
    _rotate_token(q, k, t, angles[t], interleaved, None, 0, None, None)


@cuda.jit(device=True, inline="always")
def _append_token(q, k, v, pos, base, factors, interleaved, k_cache, v_cache, q_out, bias):
    """Token blockIdx.x: its (cos, sin) table, the rotation (with the cache and q_out stores of `_rotate_token`),
    then its v rounded to f16 into v_cache row pos[t]."""
    t = cuda.blockIdx.x
    table = cuda.shared.array((MAX_PAIRS, 2), float32)
    _fill_table(table, float64(pos[t]), base, factors, q.shape[2])
    _append_rotated(q, k, v, pos, t, table, interleaved, k_cache, v_cache, q_out, bias)


@cuda.jit(device=True, inline="always")
def _append_rotated(q, k, v, pos, t, table, interleaved, k_cache, v_cache, q_out, bias):
    """Token t's rotation by ``table`` (its [hd/2, 2] (cos, sin)) with the cache, q_out and bias of
    `_rotate_token`, then its v (plus its bias) rounded to f16 into v_cache row pos[t]."""
    nkv = k.shape[1]
    hd = q.shape[2]
    row = pos[t]
    _rotate_token(q, k, t, table, interleaved, k_cache, row, q_out, bias)
    vb = (q.shape[1] + nkv) * hd
    j = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    while j < nkv * hd:
        hk = j // hd
        x = v[t, hk, j - hk * hd]
        if bias is not None:
            x += bias[vb + j]
        v_cache[row, j] = x
        j += cuda.blockDim.x * cuda.blockDim.y


@kernel
def _rope_append(q, k, v, pos, base, factors, interleaved, k_cache, v_cache):
    """`_rope`, then the token's rotated k and its v rounded to f16 into row pos[t] of k_cache / v_cache (f16
    [context, nkv * hd]): the cache holds exactly what `kernels.kv_cache.kv_append` would copy."""
    pdl_enter()
    _append_token(q, k, v, pos, base, factors, interleaved, k_cache, v_cache, None, None)


@kernel
def _rope_append_q(q, k, v, pos, base, factors, interleaved, k_cache, v_cache, q_out):
    """`_rope_append` that also writes the token's rotated q rounded to f16 into row t of q_out (f16 [nt, nh * hd]):
    everything `kernels.kv_cache.kv_append` writes after a separate rope (prefill's PFUSE_ROPE_KV)."""
    pdl_enter()
    _append_token(q, k, v, pos, base, factors, interleaved, k_cache, v_cache, q_out, None)


@kernel
def _rope_append_q_bias(q, k, v, pos, base, factors, interleaved, k_cache, v_cache, q_out, bias):
    """`_rope_append_q` with the q|k|v ``bias`` (f32 [(nh + 2 nkv) hd]) added first, as `kernels.residual.bias_add`
    before it would (a kernel of its own: numba-cuda cannot pass None as a launch argument)."""
    pdl_enter()
    _append_token(q, k, v, pos, base, factors, interleaved, k_cache, v_cache, q_out, bias)


@kernel
def _rope_append_q_tab(q, k, v, pos, angles, interleaved, k_cache, v_cache, q_out):
    """`_rope_append_q` with every token's (cos, sin) read from ``angles`` (`rope_angles`)."""
    pdl_enter()
    t = cuda.blockIdx.x
    _append_rotated(q, k, v, pos, t, angles[t], interleaved, k_cache, v_cache, q_out, None)


@kernel
def _rope_append_q_tab_bias(q, k, v, pos, angles, interleaved, k_cache, v_cache, q_out, bias):
    """`_rope_append_q_bias` with every token's (cos, sin) read from ``angles`` (`rope_angles`)."""
    pdl_enter()
    t = cuda.blockIdx.x
    _append_rotated(q, k, v, pos, t, angles[t], interleaved, k_cache, v_cache, q_out, bias)


def rope_angles(pos, base: float, head_dim: int, factors=None, out=None, stream=0):
    """Enqueue the (cos, sin) of every (token, pair) of ``pos`` and return them: f32 ``[nt, head_dim/2, 2]``, the
    values `rope` computes inside its kernels (the same float64 angle, `sincos_f64`, rounded to f32), so a `rope`
    given them as ``angles`` rotates bit for bit as without. A prefill computes them once for all its layers (every
    layer rotates the same positions; knob PROPE_ANGLES) instead of once per layer and token block.

    pos: contiguous int32 device array [nt] (0 <= pos < 1.6e6); base, factors: as `rope`; out: optional C-contiguous
    f32 device array [nt, head_dim/2, 2] (allocated when None). Raises KernelConstraintError for what `rope` refuses
    in these arguments, or a wrong out.
    """
    if not devicearray.is_cuda_ndarray(pos) or pos.dtype != np.int32 or pos.ndim != 1 or not pos.is_c_contiguous():
        raise KernelConstraintError(f"pos must be a contiguous int32 device array [nt], got "
                                    f"{getattr(pos, 'dtype', type(pos).__name__)} {tuple(getattr(pos, 'shape', ()))}")
    if not isinstance(head_dim, (int, np.integer)):
        raise KernelConstraintError(f"head_dim must be an integer, got {head_dim!r}")
    hd = int(head_dim)
    if hd < 2 or hd % 2 or hd > MAX_HEAD_DIM:
        raise KernelConstraintError(f"head_dim={hd} must be even and between 2 and {MAX_HEAD_DIM}")
    if not (isinstance(base, (int, float, np.floating)) and math.isfinite(base) and base > 0):
        raise KernelConstraintError(f"base must be a positive finite number, got {base!r}")
    factors = _check_factors(factors, hd)
    nt = pos.shape[0]
    if out is None:
        out = cuda.device_array((nt, hd // 2, 2), dtype=np.float32, stream=stream)
    elif not (devicearray.is_cuda_ndarray(out) and out.dtype == np.float32 and tuple(out.shape) == (nt, hd // 2, 2)
              and out.is_c_contiguous()):
        raise KernelConstraintError(f"out must be a C-contiguous float32 [{nt}, {hd // 2}, 2] device array, got "
                                    f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    n = nt * (hd // 2)
    if n:
        launch_kernel(_angles, min(-(-n // 256), 1024), 256, stream, (pos, np.float64(base), factors, hd, out),
                      pdl=False)
    return out


def block_shape(head_dim: int, n_heads_total: int) -> tuple[int, int]:
    """(pairs, heads) threads per block for a head_dim and the q+k head count."""
    tx = min(head_dim // 2, 128)
    return tx, max(1, min(THREADS // tx, n_heads_total))


def _check_qk(a, name: str):
    if not devicearray.is_cuda_ndarray(a):
        raise KernelConstraintError(f"{name} must be a CUDA device array, got {type(a).__name__}")
    if a.dtype != np.float32 or a.ndim != 3:
        raise KernelConstraintError(
            f"{name} must be a 3-D float32 [nt, heads, head_dim] array, got {a.dtype} with ndim {a.ndim}"
        )
    if a.shape[1] and a.shape[2] and (a.strides[2] != 4 or a.strides[1] != 4 * a.shape[2]):
        raise KernelConstraintError(
            f"{name}'s heads must be contiguous within a token (strides (*, {4 * a.shape[2]}, 4)), got {a.strides}"
        )


_ONES: dict[int, object] = {}


def _unit_factors(pairs: int):
    """A device array of ``pairs`` f32 ones (the factors of a model without ``rope_freqs``), made once per size."""
    ones = _ONES.get(pairs)
    if ones is None:
        ones = _ONES[pairs] = cuda.to_device(np.ones(pairs, dtype=np.float32))
    return ones


def rope(q, k, pos, base: float, mode: str, stream=0, pdl: bool = False, factors=None, kv_cache=None,
         q_out=None, angles=None, bias=None) -> None:
    """Enqueue the in-place rotation of q and k by their tokens' positions on ``stream``.

    q: f32 device array ``[nt, n_heads, head_dim]``; k: f32 ``[nt, n_kv_heads, head_dim]``. Within a token the
    heads must be contiguous (strides ``(any, 4*head_dim, 4)``): C-contiguous arrays, or the q/k views of a fused
    QKV output ``qkv.reshape(nt, nh + 2*nkv, hd)[:, :nh]`` / ``[:, nh:nh + nkv]``. head_dim even, the same for both.
    pos: int32 device array ``[nt]`` of positions (0 <= pos < 1.6e6). base: ``rope_freq_base`` (1e6 for
    Qwen2-7B, 5e5 for Llama-3, 1e4 for Llama-2). mode: ``"neox"`` pairs (i, i + head_dim/2) (qwen2),
    ``"norm"`` pairs (2i, 2i+1) (llama), as ggml's ROPE_TYPE_NEOX / NORMAL. pdl: a programmatic dependent launch
    (`kernels.launch`; the kernel waits for the previous one first: `kernels.ptx.pdl_enter`). factors: None, or a
    contiguous f32 device array ``[head_dim/2]`` of positive frequency divisors (a GGUF ``rope_freqs.weight``,
    Llama 3.1+): pair i turns by ``pos * base^(-2i/head_dim) / factors[i]``; the caller checks the values (the
    loader does, on the host), this function their shape. kv_cache: None, or ``(v, k_cache, v_cache)`` — v f32
    ``[nt, n_kv_heads, head_dim]`` (heads contiguous, e.g. the v view of a fused QKV output), caches f16
    ``[context, n_kv_heads * head_dim]`` C-contiguous: the same kernel then writes each token's rotated k and its v,
    rounded to f16, into cache row pos[t] (0 <= pos < context, not checked on the device), exactly what
    `kernels.kv_cache.kv_append` copies after a separate rope (decode's FUSE_ROPE_KV: one launch fewer a layer).
    q_out (with kv_cache): None, or a C-contiguous f16 device array ``[nt, n_heads * head_dim]`` that also gets each
    token's rotated q rounded to f16, kv_append's q_out (prefill's PFUSE_ROPE_KV: rope and kv_append in one launch).
    angles: None, or `rope_angles` of these positions (f32 [nt, head_dim/2, 2]): the kernel reads each token's (cos,
    sin) instead of computing them (bit-identical; with kv_cache only together with q_out). bias (with q_out): None,
    or a C-contiguous f32 device array ``[(n_heads + 2 * n_kv_heads) * head_dim]``, the q|k|v bias: added to q, k and
    v before the rotation and the stores (the f32 sums `kernels.residual.bias_add` would store first; q and k in
    place get biased and rotated, v is read, not written), so the prefill needs no bias kernel.

    Angles in f64 (see the module docstring for why); relative error against a float64 reference ~1e-7.
    Not supported, and refused by name when a file is loaded: YaRN/linear scaling, partial rotation
    (n_dims < head_dim).
    Source: RoFormer (arXiv:2104.09864); llama.cpp ``rope.cu`` (``freq_factors``), ``llm_build_llama``.

    Raises KernelConstraintError (a ValueError) for: a non-device array, a wrong dtype/rank, q/k with different
    nt or head_dim, an odd head_dim, heads not contiguous within a token, pos not an int32 ``[nt]`` array, a
    non-positive base, a mode other than "neox"/"norm", factors not a contiguous f32 ``[head_dim/2]`` device
    array, a kv_cache whose v or caches do not match k, a q_out without a kv_cache or not f16 [nt, nh * hd], angles
    not a C-contiguous f32 [nt, head_dim/2, 2] device array, angles with a kv_cache but no q_out, or a bias
    without q_out or not a C-contiguous f32 array of the q|k|v width.
    """
    _check_qk(q, "q")
    _check_qk(k, "k")
    if not devicearray.is_cuda_ndarray(pos):
        raise KernelConstraintError(f"pos must be a CUDA device array, got {type(pos).__name__}")
    nt, nh, hd = q.shape
    if k.shape[0] != nt or k.shape[2] != hd:
        raise KernelConstraintError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same nt and head_dim")
    if hd < 2 or hd % 2 or hd > MAX_HEAD_DIM:
        raise KernelConstraintError(
            f"head_dim={hd} must be even and between 2 and {MAX_HEAD_DIM} (rotations act on pairs)"
        )
    if pos.dtype != np.int32 or tuple(pos.shape) != (nt,) or not pos.is_c_contiguous():
        raise KernelConstraintError(
            f"pos must be a contiguous int32 array of shape ({nt},), got {pos.dtype} {tuple(pos.shape)}"
        )
    if not (isinstance(base, (int, float, np.floating)) and math.isfinite(base) and base > 0):
        raise KernelConstraintError(f"base must be a positive finite number, got {base!r}")
    if mode not in MODES:
        raise KernelConstraintError(f"mode={mode!r} is not supported; allowed: {', '.join(MODES)}")
    factors = _check_factors(factors, hd)
    if angles is not None and not (devicearray.is_cuda_ndarray(angles) and angles.dtype == np.float32
                                   and tuple(angles.shape) == (nt, hd // 2, 2) and angles.is_c_contiguous()):
        raise KernelConstraintError(f"angles must be a C-contiguous float32 [{nt}, {hd // 2}, 2] device array "
                                    f"(rope_angles), got {getattr(angles, 'dtype', type(angles).__name__)} "
                                    f"{tuple(getattr(angles, 'shape', ()))}")
    if angles is not None and kv_cache is not None and q_out is None:
        raise KernelConstraintError("angles serve rope alone or with kv_cache and q_out (the prefill's kernels); "
                                    "pass q_out, or no angles")
    if kv_cache is not None:
        _check_kv_cache(k, kv_cache)
    if q_out is not None:
        if kv_cache is None:
            raise KernelConstraintError("q_out is written only with kv_cache (the fused rope + KV append); "
                                        "without it use kernels.kv_cache.kv_append's q_out")
        if not (devicearray.is_cuda_ndarray(q_out) and q_out.dtype == np.float16
                and tuple(q_out.shape) == (nt, nh * hd) and q_out.is_c_contiguous()):
            raise KernelConstraintError(f"q_out must be a C-contiguous float16 [{nt}, {nh * hd}] device array, got "
                                        f"{getattr(q_out, 'dtype', type(q_out).__name__)} "
                                        f"{tuple(getattr(q_out, 'shape', ()))}")
    if bias is not None:
        width = (nh + 2 * k.shape[1]) * hd
        if q_out is None:
            raise KernelConstraintError("bias is added only by the fused rope + KV append that writes q_out (the "
                                        "prefill's PFUSE_ROPE_KV); without it use kernels.residual.bias_add first")
        if not (devicearray.is_cuda_ndarray(bias) and bias.dtype == np.float32 and tuple(bias.shape) == (width,)
                and bias.is_c_contiguous()):
            raise KernelConstraintError(f"bias must be a C-contiguous float32 [{width}] device array (q|k|v), got "
                                        f"{getattr(bias, 'dtype', type(bias).__name__)} "
                                        f"{tuple(getattr(bias, 'shape', ()))}")
    if nt == 0 or nh + k.shape[1] == 0:
        return
    if angles is not None:
        shape = block_shape(hd, nh + k.shape[1])
        if kv_cache is None:
            launch_kernel(_rope_tab, nt, shape, stream, (q, k, angles, mode == "norm"), pdl=pdl)
        else:
            v, k_cache, v_cache = kv_cache
            args = (q, k, v, pos, angles, mode == "norm", k_cache, v_cache, q_out)
            if bias is None:
                launch_kernel(_rope_append_q_tab, nt, shape, stream, args, pdl=pdl)
            else:
                launch_kernel(_rope_append_q_tab_bias, nt, shape, stream, args + (bias,), pdl=pdl)
        return
    args = (q, k, pos, np.float64(base), factors, mode == "norm")
    if kv_cache is None:
        launch_kernel(_rope, nt, block_shape(hd, nh + k.shape[1]), stream, args, pdl=pdl)
    else:
        v, k_cache, v_cache = kv_cache
        fused = args[:2] + (v,) + args[2:] + (k_cache, v_cache)
        if q_out is None:
            launch_kernel(_rope_append, nt, block_shape(hd, nh + k.shape[1]), stream, fused, pdl=pdl)
        elif bias is None:
            launch_kernel(_rope_append_q, nt, block_shape(hd, nh + k.shape[1]), stream, fused + (q_out,), pdl=pdl)
        else:
            launch_kernel(_rope_append_q_bias, nt, block_shape(hd, nh + k.shape[1]), stream, fused + (q_out, bias),
                          pdl=pdl)


def _check_factors(factors, hd: int):
    """``factors`` (a contiguous f32 device array [hd/2]) or, for None, ones; KernelConstraintError otherwise."""
    if factors is None:
        return _unit_factors(hd // 2)
    if not (devicearray.is_cuda_ndarray(factors) and factors.dtype == np.float32
            and tuple(factors.shape) == (hd // 2,) and factors.is_c_contiguous()):
        raise KernelConstraintError(f"factors must be a contiguous float32 device array of shape ({hd // 2},) "
                                    f"(one per pair), got {getattr(factors, 'dtype', type(factors).__name__)} "
                                    f"{tuple(getattr(factors, 'shape', ()))}")
    return factors


def _check_kv_cache(k, kv_cache) -> None:
    if not (isinstance(kv_cache, tuple) and len(kv_cache) == 3):
        raise KernelConstraintError("kv_cache must be a (v, k_cache, v_cache) tuple")
    v, k_cache, v_cache = kv_cache
    _check_qk(v, "v")
    if getattr(k_cache, "shape", None) != getattr(v_cache, "shape", None):
        raise KernelConstraintError(f"k_cache {tuple(getattr(k_cache, 'shape', ()))} and v_cache "
                                    f"{tuple(getattr(v_cache, 'shape', ()))} must have the same shape")
    if tuple(v.shape) != tuple(k.shape):
        raise KernelConstraintError(f"v {tuple(v.shape)} must have k's shape {tuple(k.shape)}")
    width = k.shape[1] * k.shape[2]
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not (devicearray.is_cuda_ndarray(c) and c.dtype == np.float16 and c.ndim == 2 and c.shape[1] == width
                and c.is_c_contiguous()):
            raise KernelConstraintError(f"{name} must be a C-contiguous float16 [context, {width}] device array, got "
                                        f"{getattr(c, 'dtype', type(c).__name__)} {tuple(getattr(c, 'shape', ()))}")
