"""The block-scaled int8 path (sm_90; docs/blk.md): any type dequantized to f16 at load, then
Hadamard-rotated and requantized to int8 with one f32 scale per (row, 256 of K); activations
as a rotated int8 token operand with one scale per (token, 128 of K), or per token on the
GEMMs after an rmsnorm (blk_ref.token_scaled; tuning variant no-token-scale); the persistent
wgmma kernel with stream-K (minfer.cuda.paths.blk.launch; no-stream-k) and the swiglu / geglu epilogue
(no-glu). The operand is made by a prepass, or by the rmsnorm launch and the wgmma attention's
epilogue (no-fused-prepass: separate prepasses). ffn_down stays on f16 for accuracy (f16_kinds;
no-exact-down). Lossy: gate 6 (KL divergence) holds it. Twin: minfer.cuda.paths.blk.twin."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from minfer.cuda.paths.base import Emulation, GemmPath, LinearRoute, Operand
from minfer.cuda.paths.blk.fp8 import Fp8Grid
from minfer.cuda.paths.blk.moe import BLK_EXPERTS
from minfer.cuda.paths.blk.outliers import OutlierGrid
from minfer.cuda.paths.blk.twin import BlkGrid
from minfer.cuda.runtime import devarray as da


def _scratch(rt, buf, M: int, K: int):
    """The blk token operand of [M, K] as a view of the scratch buffer (poisoned)."""
    from minfer.cuda.paths.blk.twin import blk_bytes, blk_shape

    tt = da.reshape(da.rows(buf, 0, blk_bytes(M, K)), blk_shape(M, K))
    da.poison(rt, tt)
    return tt


def _prepass(rt, A, buf, per_token: bool = False):
    from minfer.cuda.paths.blk.launch import blk_operand

    return blk_operand(rt, A, _scratch(rt, buf, *A.shape), per_token)


def _norm(rt, x, w, eps, buf, h16, t=None, per_token: bool = False):
    """The operand of f16(rmsnorm(x) * w) in the norm's launch (h16 written too when given;
    w None: of f16(x); t: x += rmsnorm(t) * w first); None when K is over the fused kernel's
    (then the separate launches)."""
    from minfer.cuda.paths.blk.launch import NORM_MAX_K, blk_operand_rmsnorm

    M, K = x.shape
    if K > NORM_MAX_K:
        return None
    return blk_operand_rmsnorm(rt, x, w, eps, _scratch(rt, buf, M, K), h16, per_token, t)


def _attn(rt, buf, M: int, K: int):
    from minfer.cuda.paths.blk.launch import BlkTokens

    tt = _scratch(rt, buf, M, K)
    return tt, BlkTokens(tt, M, K)


def _nbytes(M: int, K: int) -> int:
    from minfer.cuda.paths.blk.twin import blk_bytes

    return blk_bytes(M, K)


# both forms in one scratch buffer ("blk operand scratch"): they never meet on one activation
_SCRATCH = dict(part="blk operand scratch", nbytes=_nbytes)
BLK_OPERAND = Operand("blk", "blkop", _prepass, _norm, _attn, **_SCRATCH)
BLK_TOKEN_OPERAND = Operand(
    "blk-tok",
    "blkop",
    partial(_prepass, per_token=True),
    partial(_norm, per_token=True),
    **_SCRATCH,
)


class BlkRoute(LinearRoute):
    """mmq_blk_linear on the requantized weight (BlkWeight) and the token operand (x.K its
    width); the GEMMs after an rmsnorm read the per-token operand unless no-token-scale."""

    def __init__(self, path, qtype: int, choice, name: str = ""):
        from minfer.cuda.paths.blk.twin import token_scaled

        super().__init__(path, qtype, choice, name)
        tok = token_scaled(name) and choice.on("token-scale")
        self.operand = BLK_TOKEN_OPERAND if tok else BLK_OPERAND

    @property
    def accumulates(self) -> bool:
        return self.operand is not BLK_TOKEN_OPERAND  # no GEMM after a norm adds to C

    def _launch(self, rt, *args, **kw) -> None:
        from minfer.cuda.paths.blk.launch import mmq_blk_linear

        mmq_blk_linear(rt, *args, stream_k=self.choice.on("stream-k"), **kw)

    def run(self, rt, scratch, C, x, w, mode: str) -> None:
        from minfer.errors import Unsupported

        if mode == "f16":
            raise Unsupported(f"{self.name} writes f32, this GEMM needs f16 output")
        M, N = C.shape
        if mode != "acc":
            da.poison(rt, C)
        self._launch(rt, x, w, M, N, x.K, C, mode == "acc")

    def run_glu(self, rt, scratch, C, x, w, act: str = "silu") -> None:
        M, F = C.shape
        da.poison(rt, C)
        self._launch(rt, x, w, M, 2 * F, x.K, C, glu=act)


@dataclass(frozen=True)
class BlkPath(GemmPath):
    int8 = True
    via_f16 = True  # (then requantized by its upload: blk/upload.py)
    glu = True
    operand = BLK_OPERAND  # the route's may be the per-token form
    grid = BlkGrid()
    emulations = {
        "blk": Emulation(grid, help="the blk kernel"),
        "blk256": Emulation(BlkGrid(256), help="blk with 256-point blocks, an experiment"),
        # FP8 e4m3 block-scaled (DeepSeek-V3's grid, blk/fp8.py) on ffn_down, which blk runs
        # on f16: CPU emulations for gate 6, no kernel (docs/perplexity.md)
        "blk-fp8down": Emulation(
            grid,
            kinds={"ffn_down": Fp8Grid()},
            help="blk, ffn_down on FP8 e4m3 per (token, 128) x (row, 128), no kernel",
        ),
        "blk-fp8down-tile": Emulation(
            grid,
            kinds={"ffn_down": Fp8Grid(128)},
            help="blk-fp8down with weights per (128 x 128) tile",
        ),
        "blk-fp8down-p2": Emulation(
            grid,
            kinds={"ffn_down": Fp8Grid(pow2=True)},
            help="blk-fp8down with power-of-two scales",
        ),
        # int8 with each ffn_down's 128 busiest input channels on f16 (blk/outliers.py): passes
        # gate 6 on the CPU; its kernels: --gemm blk-split (opt-in, not yet run on a GPU)
        "blk-int8down": Emulation(
            grid,
            kinds={"ffn_down": OutlierGrid(grid)},
            help="blk, ffn_down on int8 but its 128 busiest input channels (calibrated) f16,"
            " no kernel",
        ),
        "blk-fp8down-ao": Emulation(
            grid,
            kinds={"ffn_down": Fp8Grid(), "attn_output": Fp8Grid()},
            help="blk-fp8down with attn_output on FP8 too",
        ),
    }
    scratch_parts = ("blk operand scratch", "blk requant staging", "MMQ stream-K workspace")

    def memory(self, units, T: int, sms: int) -> tuple[dict, dict]:
        """~1 B per weight in the kernel's tiles (twin.blk_bytes, rows padded to 128, per
        weight or fused group: a group requantizes as one); while requantizing, one weight's
        or group's f16 ("blk requant staging"); the token operand at the largest K and the
        stream-K workspace (a slot per SM)."""
        from minfer.cuda.paths.blk.stream_k import SK_SLOT_BYTES
        from minfer.cuda.paths.blk.twin import blk_bytes

        K = max(u[1] for u in units)
        return {"MMQ weights": sum(blk_bytes(r, k) for r, k, _, _ in units)}, {
            "blk operand scratch": BLK_OPERAND.nbytes(T, K),  # (blk-split's operand is other)
            "blk requant staging": max(r * k * 2 for r, k, _, _ in units),
            "MMQ stream-K workspace": sms * (SK_SLOT_BYTES + 4),
        }

    def smem(self, qtype: int) -> int | None:
        from minfer.cuda.paths.blk.launch import blk_smem

        return blk_smem()

    def route(self, qtype: int, choice, name: str = "") -> BlkRoute:
        return BlkRoute(self, qtype, choice, name)

    def upload(self, rt, up, parts, name: str, dst=None, glu: bool = False):
        from minfer.cuda.paths.blk import upload

        assert dst is None  # (dest: None, the group's f16 is made when its upload starts)
        return upload.upload(rt, up, parts, name, glu)

    def twin(self, x, w_raw, qtype: int, M: int, N: int, K: int, name: str = ""):
        from minfer.cuda.ops.dequant import dequant_f16_ref
        from minfer.cuda.paths.blk.twin import blk_linear_ref, token_scaled

        return blk_linear_ref(
            np.asarray(x, np.float32).reshape(M, K),
            dequant_f16_ref(w_raw, qtype, N, K),
            per_token=token_scaled(name),
        )

    def load_kernels(self):
        from minfer.cuda.paths.blk.launch import _OPTS

        return super().load_kernels() + [("mmq_blk", _OPTS)]


# any type; ffn_down stays f16: its int8 grid is most of the path's KL divergence (docs/blk.md)
BLK = BlkPath(
    "blk",
    "mmq_blk",
    None,
    frozenset({"sm_90"}),
    32,
    {None: 16896 / 16384},
    variants=("glu", "stream-k", "fused-prepass", "token-scale", "exact-down"),
    gemv_f16=True,
    f16_kinds=frozenset({"ffn_down"}),
    experts=BLK_EXPERTS,
)
