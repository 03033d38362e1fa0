"""Linear routes of the CUDA forward: one object per linear weight, made from its path record
(minfer.cuda.plan.paths), that owns the weight's activation prepass, its launch and its epilogues,
so the forward (minfer.cuda.backend) never branches on path names.

- `route.activation`: the input form its kernel reads ("none": the f16 activation; "q8_1": q8_1
  raw blocks; "blk-operand": the block path's rotated int8 token operand; "blk-operand-tok": the
  same with one scale per token, for the GEMMs after an rmsnorm (blk_ref.token_scaled)).
  `PREPASS[kind](rt, A, scratch)` makes one form from an f16 activation, one activation
  feeding every route that reads the form; `NORM_PREPASS[kind]` makes it from the residual in the rmsnorm's launch,
  `ATTN_OPERAND[kind]` the attention launch from its epilogue.
- `route.run(be, C, x, w, mode)`: C (mode 'f32' =, 'f16' =, 'acc' +=) x @ w.T.
- `route.glu`: whether its gate|up GEMM can write silu(gate) * up from its epilogue
  (`route.run_glu(be, C, x, w)`).
`make_route(path_name, qtype, choice, name)` picks the class from the record's weight
preparation.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.cuda.plan.paths import TABLE
from minfer.errors import Unsupported

# the buffer of DeviceBuffers each activation form lives in (one input is read in one form: the
# forms that share a buffer never meet on one activation)
SCRATCH = {"q8_1": "q8", "blk-operand": "blkop", "blk-operand-tok": "blkop"}


def _prepass_q8_1(rt, A, buf):
    from minfer.cuda.ops.mmq import quantize_q8_1

    M, K = A.shape
    q8 = da.reshape(da.rows(buf, 0, M * (K // 32) * 40), (M, K // 32 * 40))
    da.poison(rt, q8)
    return quantize_q8_1(rt, A, q8)


def _blk_scratch(rt, buf, M: int, K: int):
    """The blk token operand of [M, K] as a view of the scratch buffer (poisoned)."""
    from minfer.quants.blk_ref import blk_bytes, blk_shape

    tt = da.reshape(da.rows(buf, 0, blk_bytes(M, K)), blk_shape(M, K))
    da.poison(rt, tt)
    return tt


def _prepass_blk(rt, A, buf, per_token: bool = False):
    from minfer.cuda.ops.mmq_blk import blk_operand

    return blk_operand(rt, A, _blk_scratch(rt, buf, *A.shape), per_token)


PREPASS = {"q8_1": _prepass_q8_1, "blk-operand": _prepass_blk,
           "blk-operand-tok": partial(_prepass_blk, per_token=True)}


def _norm_prepass_blk(rt, x, w, eps, buf, h16, per_token: bool = False):
    """The blk token operand of f16(rmsnorm(x) * w) in the norm's launch (h16 written too when
    given); None when K is over the fused kernel's (then rmsnorm, then PREPASS)."""
    from minfer.cuda.ops.mmq_blk import NORM_MAX_K, blk_operand_rmsnorm

    M, K = x.shape
    if K > NORM_MAX_K:
        return None
    return blk_operand_rmsnorm(rt, x, w, eps, _blk_scratch(rt, buf, M, K), h16, per_token)


def _attn_operand_blk(rt, buf, M: int, K: int):
    from minfer.cuda.ops.mmq_blk import BlkTokens

    tt = _blk_scratch(rt, buf, M, K)
    return tt, BlkTokens(tt, M, K)


# forms whose prepass can run inside the rmsnorm launch: (rt, x, w, eps, scratch, h16 or None)
NORM_PREPASS = {"blk-operand": _norm_prepass_blk,
                "blk-operand-tok": partial(_norm_prepass_blk, per_token=True)}
# forms the attention launch can write from its epilogue (attention.operand_fuses): (rt,
# scratch, M, K) -> (the array it writes, the GEMM's input form)
ATTN_OPERAND = {"blk-operand": _attn_operand_blk}


class LinearRoute:
    activation = "none"

    def __init__(self, path, qtype: int, choice, name: str = ""):
        self.path, self.qtype, self.choice = path, int(qtype), choice

    @property
    def name(self) -> str:
        return self.path.name

    glu = False

    def run(self, be, C, x, w, mode: str) -> None:
        raise NotImplementedError

    def run_glu(self, be, C, x, w) -> None:
        raise Unsupported(f"{self.name}: no swiglu epilogue")


class F16Route(LinearRoute):
    """gemm_f16_nt on the dequantized f16 weight; glu at M == 1: the GEMV's f32 into gu32,
    then the interleaved swiglu launch (the GEMV has no epilogue)."""
    glu = True

    def run(self, be, C, x, w, mode: str) -> None:
        from minfer.cuda.ops.gemm import gemm_f16_nt

        if mode == "acc":
            gemm_f16_nt(x, w, np.float32, accumulate=C, rt=be.rt)
            return
        da.poison(be.rt, C)   # debug / poison mode: NaN unless the GEMM really writes C
        gemm_f16_nt(x, w, np.float16 if mode == "f16" else np.float32, out=C, rt=be.rt)

    def run_glu(self, be, C, x, w) -> None:
        from minfer.cuda.ops import layers as L
        from minfer.cuda.ops.gemm import gemm_f16_nt

        M = x.shape[0]
        da.poison(be.rt, C)
        if M > 1:
            gemm_f16_nt(x, w, np.float16, out=C, rt=be.rt, glu=True)
            return
        gu = be._part(be.buf.gu32, 0, (M, 2 * C.shape[1]))
        gemm_f16_nt(x, w, np.float32, out=gu, rt=be.rt)
        L.swiglu_interleaved(be.rt, C, gu)


class RawInt8Route(LinearRoute):
    """The seeds' int8 kernels on the raw GGUF bytes, q8_1 activations."""
    activation = "q8_1"

    def run(self, be, C, x, w, mode: str) -> None:
        from minfer.cuda.ops.mmq import mmq_linear

        if mode == "f16":
            raise Unsupported(f"{self.name} writes f32, this GEMM needs f16 output")
        M, N = C.shape
        K = x.shape[1] * 32 // 40
        if mode != "acc":
            da.poison(be.rt, C)
        mmq_linear(be.rt, x, w, self.qtype, M, N, K, self.path, C, accumulate=mode == "acc")


class BlkRoute(LinearRoute):
    """The block-scaled int8 kernel (persistent wgmma, minfer.cuda.ops.mmq_blk.mmq_blk_linear) on
    the requantized weight (BlkWeight) and the blk token operand (x: the operand, x.K its width),
    stream-K unless the tuning variant no-stream-k; the swiglu epilogue on any type. The GEMMs
    after an rmsnorm (blk_ref.token_scaled) read the operand with one scale per token (a
    shorter fold) unless the tuning variant no-token-scale."""
    glu = True

    def __init__(self, path, qtype: int, choice, name: str = ""):
        from minfer.quants.blk_ref import token_scaled

        super().__init__(path, qtype, choice, name)
        tok = token_scaled(name) and choice.on("token-scale")
        self.activation = "blk-operand-tok" if tok else "blk-operand"

    def _launch(self, be, *args, **kw) -> None:
        from minfer.cuda.ops.mmq_blk import mmq_blk_linear

        mmq_blk_linear(be.rt, *args, stream_k=self.choice.on("stream-k"), **kw)

    def run(self, be, C, x, w, mode: str) -> None:
        if mode == "f16":
            raise Unsupported(f"{self.name} writes f32, this GEMM needs f16 output")
        M, N = C.shape
        if mode != "acc":
            da.poison(be.rt, C)
        self._launch(be, x, w, M, N, x.K, C, mode == "acc")

    def run_glu(self, be, C, x, w) -> None:
        M, F = C.shape
        da.poison(be.rt, C)
        self._launch(be, x, w, M, 2 * F, x.K, C, swiglu=True)


ROUTES = {"dequant-f16": F16Route, "raw": RawInt8Route, "requant-blk": BlkRoute}


def make_route(path_name: str, qtype: int, choice, name: str = "") -> LinearRoute:
    """The route of weight `name` (its role decides blk's token operand form) on `path_name`."""
    p = TABLE[path_name]
    return ROUTES[p.weight](p, qtype, choice, name)
