"""Experiment `gemv`: decode mat-vec ``y[od] = W[od, id] · x[id]`` straight from GGUF blocks (`kernels.gemv`).

Knobs: the fields of `kernels.gemv.GemvConfig` (`GemvConfig.knob_specs`, one knob each): TYPE (W's GGUF format;
every one `kernels.gemv` supports), RPB (rows per CUDA block, decoded together by each warp so x is loaded once per
RPB rows), WPR (warps per row; threads per block = 32 * WPR), STAGE (shared-memory slots per warp that chunks pass
through before they are decoded: 2-4 a cp.async ring that keeps STAGE - 1 chunks in flight; the 2-byte-aligned
TYPEs `kernels.gemv.STAGE_TYPES`, W a whole number of 16-byte vectors), MINB (CUDA blocks per SM the kernel is
compiled for: ``__launch_bounds__``'s register cap, 0 none), FOLD (1: Q6_K's -32 offset enters each plane's dp4a
chain once per chunk from x, not per word and row; MMVQ=1), PDL (1: programmatic dependent launch, each timed
launch starting in the previous one's tail: `kernels.launch`), GLU (1: decode's fused gate/up pass,
`kernels.gemv.gemv_glu`: a second W of the same TYPE and shape, y = silu(W·x) * (W_up·x), both weights' bytes
counted), MMVQ (1: x is quantized to Q8_1 blocks once, untimed, when the input set is made, and the int8/dp4a
kernel runs; TYPE must be one of `kernels.gemv.MMVQ_TYPES`. The quantization's own cost is in the model-level
tg A/B, where one quantized x serves several mat-vecs), XRES (1, with MMVQ=1: x in compensated Q8_1, a second
int8 residual per element at d/254 and a second dp4a chain: `kernels.quantize_q8`).
Workloads: the nt = 1 projections of one Qwen2-7B layer (hidden 3584, FFN 18944, 28 q heads + 2x4 kv heads of
128 -> fused qkv 4608) and its vocabulary head (152064 x 3584), plus a tiny shape for the CUDA simulator.
Cost model: 2*od*id FLOPs; fewest bytes = W's quantized bytes + x read once (4*id) + y written once (4*od);
ceiling "copy" (a mat-vec is bandwidth-bound: % of the measured device-to-device copy bandwidth).
Reference: numpy float64 ``gguf.quants.dequantize(W) @ x`` on the host from the same input bytes; the check is
the relative error ‖y − ref‖ / ‖ref‖, tolerance 1e-5 (float32 accumulation gives ~1e-7 here; float weights
F16/BF16/F32 are exact inputs, so the same bound holds for them). MMVQ=1: the same product with x replaced by
its Q8_1 values (`reference_mmvq`; XRES=1: its compensated values d * (q + r/254)), same tolerance.
"""

from __future__ import annotations

import weakref

import numpy as np

from kernels.errors import KernelConstraintError
from kernels.gemv.config import GemvConfig
from kernels.gemv.tables import GEMV_TYPES, MMVQ_TYPES
from kernels.quant.formats import block_format
from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register, rel_l2
from minfer_cli.knobs import Knob
from minfer_cli.quant_blocks import random_blocks

TOLERANCE = 1e-5


class _InputSet:
    """One input set: a seed, the f32 activation x (device) and, per TYPE, the device bytes of a random valid W."""

    def __init__(self, seed: int, od: int, id: int) -> None:
        from numba import cuda

        self.seed = seed
        self.od, self.id = od, id
        rng = np.random.default_rng([seed, 0])
        self.x_host = rng.standard_normal(id).astype(np.float32)
        self.x = cuda.to_device(self.x_host)
        self.raw: dict[str, object] = {}
        self._q8: dict[bool, object] = {}

    def q8(self, compensated: bool = False):
        """x quantized to Q8_1 blocks on the device, ``compensated`` with their residual values (XRES=1); made at
        first use, outside any timing."""
        if compensated not in self._q8:
            from kernels.quantize_q8 import q8_blocks, quantize_q8_1

            self._q8[compensated] = quantize_q8_1(self.x, q8_blocks(self.id, compensated=compensated))
        return self._q8[compensated]

    def materialise(self, qtype: str, up: bool = False):
        """W's device bytes for ``qtype`` (``up``: the second, independent weight of a GLU arm)."""
        key = (qtype, bool(up))
        raw = self.raw.get(key)
        if raw is None:
            from numba import cuda

            rng = np.random.default_rng([self.seed, 1 + GEMV_TYPES.index(qtype), int(up)])
            raw = self.raw[key] = cuda.to_device(random_blocks(qtype, self.od, self.id, rng))
        return raw


def _rows(raw_host: np.ndarray, qtype: str, od: int, id: int) -> np.ndarray:
    """W's bytes as ``[od, row bytes]`` uint8 rows."""
    return np.ascontiguousarray(raw_host, dtype=np.uint8).reshape(od, block_format(qtype).row_bytes(id))


def _dequantized(rows: np.ndarray, qtype: str, od: int, id: int) -> np.ndarray:
    """float64 ``[od, id]`` W from its byte rows (gguf-py ``quants.dequantize``)."""
    from gguf import quants

    return quants.dequantize(rows, block_format(qtype).qtype).reshape(od, id).astype(np.float64)


def reference(raw_host: np.ndarray, qtype: str, od: int, id: int, x: np.ndarray) -> np.ndarray:
    """float64 ``dequantize(W) @ x`` (gguf-py ``quants.dequantize``, then numpy in float64)."""
    return _dequantized(_rows(raw_host, qtype, od, id), qtype, od, id) @ x.astype(np.float64)


def quantized_x(x: np.ndarray, compensated: bool = False) -> np.ndarray:
    """float64 values of x after Q8_1 quantization (`kernels.quantize_q8`): int8 values from gguf-py's own Q8_0
    quantizer (``quants.quantize``, the same rounding), times d = max|x| / 127 in float32 per 32-block.
    ``compensated``: plus d * r / 254 with the residual values r = roundf((x * (1/d) - q) * 254), computed in
    float32 as the kernel does (gguf-py's ``np_roundf``)."""
    from gguf import GGMLQuantizationType, quants

    blocks = x.astype(np.float32).reshape(-1, 32)
    packed = quants.quantize(blocks, GGMLQuantizationType.Q8_0).reshape(-1, 34)
    q = packed[:, 2:].copy().view(np.int8).astype(np.float32)
    d32 = np.abs(blocks).max(axis=1) / np.float32(127)
    values = q.astype(np.float64)
    if compensated:
        with np.errstate(divide="ignore"):
            inv = np.where(d32 != 0, np.float32(1) / d32, np.float32(0)).astype(np.float32)
        r = quants.np_roundf((blocks * inv[:, None] - q) * np.float32(254)).astype(np.float64)
        assert np.abs(r).max(initial=0) <= 127, "a residual value outside int8"
        values = values + r / 254
    return (values * d32.astype(np.float64)[:, None]).reshape(-1)


def reference_mmvq(raw_host: np.ndarray, qtype: str, od: int, id: int, x: np.ndarray,
                   compensated: bool = False) -> np.ndarray:
    """float64 result of the MMVQ kernel's arithmetic: ``dequantize(W) @ quantized_x(x, compensated)``, except that
    a format with a min term (Q4_K: ``w = d*sc*q - dmin*m``) takes that term against the unquantized x (the kernel
    uses each block's exact sum of x): W is split with gguf-py itself, dequantizing once more with dmin set to 0."""
    rows = _rows(raw_host, qtype, od, id)
    w = _dequantized(rows, qtype, od, id)
    xq = quantized_x(x, compensated)
    if qtype != "Q4_K":
        return w @ xq
    no_min = rows.reshape(od, -1, block_format(qtype).type_size).copy()
    no_min[:, :, 2:4] = 0  # block_q4_K: d (f16) | dmin (f16) | scales | qs
    w_scaled = _dequantized(no_min.reshape(od, -1), qtype, od, id)
    return w_scaled @ xq - (w_scaled - w) @ x.astype(np.float64)


def abs_product(raw_host: np.ndarray, qtype: str, od: int, id: int, x: np.ndarray) -> np.ndarray:
    """float64 ``|dequantize(W)| @ |x|``: each row's sum of |w·x|, the scale of a dot product's rounding error
    (its condition: Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1)."""
    return np.abs(_dequantized(_rows(raw_host, qtype, od, id), qtype, od, id)) @ np.abs(x.astype(np.float64))


F32_EXP_MAX = float(np.log(np.finfo(np.float32).max))  # 88.72: f32's exp is inf above it


def glu_error(y: np.ndarray, g: np.ndarray, u: np.ndarray, g_abs: np.ndarray, u_abs: np.ndarray) -> float:
    """The error of a SwiGLU output y against float64, in units that f32 rounding can reach: ``‖y − ref‖ / ‖c‖``.

    ref = silu(g) * u from the float64 products g = Wg·x, u = Wu·x, with exp(-g) = inf where f32's exp is
    (-g > 88.72: silu is -0, as the kernels compute it). c is the first-order propagation of the products'
    rounding scales g_abs = |Wg|·|x| and u_abs = |Wu|·|x| through silu(g) * u: ``c = |silu(g)|·u_abs +
    |silu'(g)·u|·g_abs``. A plain ‖y − ref‖ / ‖ref‖ is not a usable check here: silu sends most random rows to
    about 0, and the remaining few can be products with cancellation, whose relative error f32 cannot bound.
    ‖c‖ is floored at f32's smallest normal over its epsilon, so differences among flushed subnormals never
    count. inf when y holds a NaN (an element never written)."""
    y = np.asarray(y, dtype=np.float64)
    if not np.isfinite(y).all():
        return float("inf")
    e = np.where(-g > F32_EXP_MAX, np.inf, np.exp(np.minimum(-g, F32_EXP_MAX)))
    sig = 1.0 / (1.0 + e)
    silu = g * sig
    c = np.abs(silu) * u_abs + np.abs(sig * (1.0 + g * (1.0 - sig)) * u) * g_abs
    f32 = np.finfo(np.float32)
    return float(np.linalg.norm(y - silu * u) / max(np.linalg.norm(c), float(f32.tiny / f32.eps)))


class GemvExperiment(Experiment):
    name = "gemv"
    purpose = "decode mat-vec y = W·x reading GGUF blocks directly (f32 x, f32 accumulate) vs the copy ceiling"
    knobs = tuple(Knob(*spec) for spec in GemvConfig.knob_specs())
    workloads = (
        Workload("ffn_up", {"od": 18944, "id": 3584}, "Qwen2-7B FFN up/gate projection, nt=1"),
        Workload("ffn_down", {"od": 3584, "id": 18944}, "Qwen2-7B FFN down projection, nt=1"),
        Workload("attn_qkv", {"od": 4608, "id": 3584}, "Qwen2-7B fused q|k|v projection (3584+512+512), nt=1"),
        Workload("attn_output", {"od": 3584, "id": 3584}, "Qwen2-7B attention output projection, nt=1"),
        Workload("output", {"od": 152064, "id": 3584}, "Qwen2-7B vocabulary head (lm_head), nt=1"),
        Workload("ffn_up_1_5b", {"od": 8960, "id": 1536}, "Qwen2-1.5B FFN up/gate projection, nt=1"),
        Workload("ffn_down_1_5b", {"od": 1536, "id": 8960}, "Qwen2-1.5B FFN down projection, nt=1"),
        Workload("attn_qkv_1_5b", {"od": 2048, "id": 1536}, "Qwen2-1.5B fused q|k|v projection (1536+256+256), nt=1"),
        Workload("attn_output_1_5b", {"od": 1536, "id": 1536}, "Qwen2-1.5B attention output projection, nt=1"),
        Workload("output_1_5b", {"od": 151936, "id": 1536}, "Qwen2-1.5B vocabulary head (the tied embedding), nt=1"),
        Workload("tiny", {"od": 5, "id": 512}, "5 x 512, for the CUDA simulator in CI (a partial last CUDA block)"),
    )
    ceiling = "copy"
    work_knobs = ("TYPE", "GLU")
    removed_knobs = {"UNROLL": 1, "PREFETCH": 0, "HOIST": 0, "VLOAD": 0, "GRID": 0}
    """Variants deleted after they lost their A/B (their records name the commit that had them); each value here is
    what the code still runs."""

    def __init__(self) -> None:
        self._sets: dict[str, weakref.WeakSet] = {}

    @staticmethod
    def _shape(workload: Workload) -> tuple[int, int]:
        return workload.shape["od"], workload.shape["id"]

    def _quant_bytes(self, qtype: str, workload: Workload) -> int:
        od, id = self._shape(workload)
        return od * block_format(qtype).row_bytes(id)

    def input_set_bytes(self, workload: Workload) -> int:
        """The smallest W any TYPE gives for this shape (Q2_K) plus x: the ring is sized before the arm is known,
        so a larger TYPE only makes the ring larger, never smaller than the L2-defeating size."""
        od, id = self._shape(workload)
        return min(self._quant_bytes(t, workload) for t in GEMV_TYPES) + 4 * id

    def make_input_set(self, workload: Workload, rng):
        """Fresh x now; W's bytes per TYPE when ``prepare`` materialises the arm's TYPE on every live set."""
        od, id = self._shape(workload)
        inputs = _InputSet(int(rng.integers(0, 2**63)), od, id)
        self._sets.setdefault(workload.name, weakref.WeakSet()).add(inputs)
        return inputs

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array(self._shape(workload)[0], dtype=np.float32)

    def refuse(self, config, workload):
        """MMVQ=1 for a TYPE without an MMVQ kernel; a combination `kernels.gemv.GemvConfig` refuses (STAGE for the
        TYPE or its shared memory, FOLD without MMVQ or for another TYPE, MINB beyond the SM's threads); STAGE where
        W of this workload is not a whole number of 16-byte vectors (`GemvConfig.weight_refusal`)."""
        qtype = str(config["TYPE"])
        if int(config["MMVQ"]) and qtype not in MMVQ_TYPES:
            return f"MMVQ=1 needs TYPE one of {', '.join(MMVQ_TYPES)} (the formats with an int8 kernel), got {qtype}"
        try:
            gemv = GemvConfig.from_knobs(config)
        except KernelConstraintError as e:
            return str(e)
        return gemv.weight_refusal(nbytes=self._quant_bytes(qtype, workload), what=f"{workload.name}'s W")

    def prepare(self, config, workload):
        from kernels.gemv import gemv_glu, gemv_q, kernel_for  # numba: imported when GPU work starts

        gemv = GemvConfig.from_knobs(config)  # refuses a bad combination
        qtype, od, id = gemv.qtype, *self._shape(workload)
        kernel_for(gemv)
        for inputs in list(self._sets.get(workload.name, ())):
            inputs.materialise(qtype)
            if gemv.glu:
                inputs.materialise(qtype, up=True)
            if gemv.mmvq:
                inputs.q8(gemv.xres)  # quantize x now, outside the timed launches

        def launch(inputs, output, stream):
            raw = inputs.materialise(qtype)  # a dict lookup once prepare has run
            x = inputs.q8(gemv.xres) if gemv.mmvq else inputs.x
            if gemv.glu:
                gemv_glu(raw, inputs.materialise(qtype, up=True), qtype, od, id, x, output, config=gemv, stream=stream)
            else:
                gemv_q(raw, qtype, od, id, x, output, config=gemv, stream=stream)

        return launch

    def poison(self, output) -> None:
        from numba import cuda

        output.copy_to_device(np.full(output.shape, np.nan, dtype=np.float32))
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        """‖y − ref‖ / ‖ref‖ against float64 ``dequantize(W) @ x`` (MMVQ: `reference_mmvq`, compensated with
        XRES=1); GLU: `glu_error` of the two weights' float64 products. inf if any element is still NaN."""
        qtype = str(config["TYPE"])
        od, id = self._shape(workload)
        if int(config.get("MMVQ", 0)):
            def ref_fn(*args):
                return reference_mmvq(*args, compensated=bool(int(config.get("XRES", 0))))
        else:
            ref_fn = reference
        w = inputs.materialise(qtype).copy_to_host()
        ref = ref_fn(w, qtype, od, id, inputs.x_host)
        if not int(config.get("GLU", 0)):
            return rel_l2(output.copy_to_host(), ref)
        w_up = inputs.materialise(qtype, up=True).copy_to_host()
        up = ref_fn(w_up, qtype, od, id, inputs.x_host)
        return glu_error(output.copy_to_host(), ref, up, abs_product(w, qtype, od, id, inputs.x_host),
                         abs_product(w_up, qtype, od, id, inputs.x_host))

    def tolerance(self, config, workload) -> float:
        return TOLERANCE

    def kernels(self, config, workload):
        from kernels.gemv import kernel_for, kernel_signature

        gemv = GemvConfig.from_knobs(config)
        dispatcher, signature = kernel_for(gemv), kernel_signature(gemv)
        dispatcher.compile(signature)
        k = gemv.knob_values()
        name = (f"gemv[{gemv.qtype},RPB={gemv.rows_per_block},WPR={gemv.warps_per_row}"
                + "".join(f",{n}={k[n]}" for n in ("STAGE", "MINB") if k[n])
                + "".join(f",{n}" for n in ("FOLD", "PDL", "GLU", "MMVQ", "XRES") if k[n]) + "]")
        return [KernelInstance(name, dispatcher, signature, gemv.threads)]

    def cost(self, workload: Workload, config=None) -> Cost:
        """2*od*id FLOPs per weight; W's quantized bytes (``config``'s TYPE, default Q4_K; GLU: two weights) + x
        read once (4*id bytes in f32; MMVQ: id int8 + 8 bytes of d and sum per 32, XRES: id more int8) + 4*od (y)."""
        qtype = str((config or {}).get("TYPE", "Q4_K"))
        od, id = self._shape(workload)
        weights = 2 if int((config or {}).get("GLU", 0)) else 1
        x_bytes = id * (1 + int((config or {}).get("XRES", 0))) + 8 * (id // 32) \
            if int((config or {}).get("MMVQ", 0)) else 4 * id
        return Cost(flops=2.0 * od * id * weights,
                    bytes=float(weights * self._quant_bytes(qtype, workload) + x_bytes + 4 * od))


register(GemvExperiment())
