"""blk-split (`--gemm blk-split`, opt-in: auto never takes it): blk with ffn_down off f16 too,
on blk's int8 grid but for each ffn_down's N_OUTLIERS busiest input channels, kept on f16
(outliers.py: the grid `minfer perplexity --emulate blk-int8down` passes gate 6 with on the
CPU). Correct on the H100 and slower than blk there (docs/blk.md, "blk-split").

    y = blk(A with columns O zeroed) @ blk(W with columns O zeroed).T + A[:, O] @ W[:, O].T

Upload of ffn_down: f16 as blk's, blk_split_cols moves W[:, O] into Wo f16 [N, n] (kept) and
zeroes them, then blk's requant of the rest (SplitWeight: both and O on the device). O per
weight: the calibration's (GemmChoice.channels, reaching the upload as Staging.channels);
uncalibrated (`minfer check`, the tests) the first n channels, which upload and twin agree on.
The route: its operand is deferred (SplitInput), because O belongs to the weight, which only
run sees: there blk_split_cols moves A[:, O] into Xo (the scratch "blk split scratch") and
zeroes them in A (the input is consumed: ffn_down's swiglu output, read by nothing after),
then blk's per-(token, 128) prepass into blk's operand scratch, blk's GEMM (=, +=), and the
f16 GEMM Xo @ Wo.T accumulated into C. Every other weight runs as on blk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.paths.base import Operand
from minfer.cuda.paths.blk.outliers import N_OUTLIERS, check_cols, split_linear_ref
from minfer.cuda.paths.blk.path import BLK, BLK_OPERAND, BlkPath, BlkRoute
from minfer.cuda.runtime import devarray as da

SPLIT_KINDS = frozenset({"ffn_down"})  # the weights blk-split splits (blk leaves them f16)


def split_n(K: int) -> int:
    """Channels kept on f16 of a weight of K inputs (all of them when K <= N_OUTLIERS)."""
    return min(N_OUTLIERS, K)


def splits(name: str) -> bool:
    """Whether weight `name` ("blk.3.ffn_down.weight") runs split."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in SPLIT_KINDS


def default_cols(K: int) -> np.ndarray:
    """The channels of an uncalibrated weight: the first split_n(K) (upload and twin agree)."""
    return np.arange(split_n(K), dtype=np.int32)


@dataclass(frozen=True)
class SplitInput:
    """The deferred operand: the f16 activation A [M, K] and the Xo scratch buffer."""

    A: object
    buf: object


def _prepass(rt, A, buf):
    return SplitInput(A, buf)


SPLIT_OPERAND = Operand(
    "blk-split",
    "blksplit",
    _prepass,
    part="blk split scratch",
    nbytes=lambda M, K: M * split_n(K) * 2,  # Xo f16 [M, n]
)


@dataclass
class SplitWeight(da.DeviceArrays):
    """ffn_down on blk-split: wb (BlkWeight's bytes of W with columns cols zeroed), wo f16
    [N, n] = W[:, cols], cols int32 [n] ascending."""

    wb: object
    wo: object
    cols: object
    N: int
    K: int

    @property
    def blk(self):
        from minfer.cuda.paths.blk.launch import BlkWeight

        return BlkWeight(self.wb, self.N, self.K)


class SplitRoute(BlkRoute):
    """ffn_down's route on blk-split (the module docstring)."""

    def __init__(self, path, qtype: int, choice, name: str = ""):
        super().__init__(path, qtype, choice, name)
        self.operand = SPLIT_OPERAND

    @property
    def accumulates(self) -> bool:
        return True

    def run(self, rt, scratch, C, x, w, mode: str) -> None:
        from minfer.cuda.paths.blk.launch import blk_operand
        from minfer.cuda.paths.blk.path import _scratch
        from minfer.cuda.paths.blk.split import blk_split_cols
        from minfer.cuda.paths.f16.gemm import gemm_f16_nt
        from minfer.errors import GPUError, Unsupported

        if mode == "f16":
            raise Unsupported(f"{self.name} writes f32, this GEMM needs f16 output")
        M, N = C.shape
        K = int(x.A.shape[1])
        n = int(w.cols.shape[0])
        if x.buf.nbytes < M * n * 2:
            raise GPUError(f"{self.name}: {x.buf.nbytes} B of split scratch for Xo [{M}, {n}]")
        xo = da.view(da.ptr(x.buf), (M, n), np.float16, base=x.buf)  # (the buffer's start)
        blk_split_cols(rt, x.A, w.cols, xo)
        buf = scratch.operands[BLK_OPERAND.scratch]
        tt = blk_operand(rt, x.A, _scratch(rt, buf, M, K))
        if mode != "acc":
            da.poison(rt, C)
        self._launch(rt, tt, w.blk, M, N, K, C, mode == "acc")
        gemm_f16_nt(xo, w.wo, accumulate=C, rt=rt)

    def run_glu(self, rt, scratch, C, x, w, act: str = "silu") -> None:
        from minfer.errors import Unsupported

        raise Unsupported(f"{self.name}: {self.weight} has no glu epilogue")


def upload_split(rt, up, parts, name: str):
    """(SplitWeight, {}) of a lone split weight: f16 up (blk's first step), the kept columns
    moved into Wo, the rest requantized; the f16 freed once done (blk's staging)."""
    from minfer.cuda.paths.blk.launch import blk_weight
    from minfer.cuda.paths.blk.split import blk_split_cols
    from minfer.cuda.paths.f16 import upload as f16_upload
    from minfer.errors import GPUError

    if len(parts) != 1:
        raise GPUError(f"blk-split: {name} is a fused group; only a lone weight splits")
    f16, _ = f16_upload.upload(rt, up, parts, name)
    N, K = (int(s) for s in f16.shape)
    chans = (getattr(up, "channels", None) or {}).get(name)
    try:
        cols = check_cols(default_cols(K) if chans is None else chans, K, f"{name} channels")
    except ValueError as e:
        raise GPUError(f"blk-split: {e}") from None
    cols_d = da.to_device(rt, cols, f"blk split cols {name}")
    wo = da.empty(rt, (N, cols.size), np.float16, f"blk split f16 columns {name}")
    blk_split_cols(rt, f16, cols_d, wo)
    wb = blk_weight(rt, f16, name)
    rt.synchronize()
    f16.gpudata.free()
    return SplitWeight(wb.wb, wo, cols_d, N, K), {}


@dataclass(frozen=True)
class BlkSplitPath(BlkPath):
    """blk, with SPLIT_KINDS on SplitRoute (f16_kinds empty: nothing left on f16 for
    accuracy). path.operand is the split form (so the memory plan and `minfer check` make its
    scratch); every other route reads blk's own forms (BlkRoute)."""

    operand = SPLIT_OPERAND
    emulations = {}  # (blk's: `--emulate blk-int8down` is this path's grid on the CPU)
    weight_parts = ("MMQ weights", "blk split f16 columns")
    opt_in = True  # only when named: 0.92-0.96x blk's speed on the H100 (docs/blk.md)
    calibrated_kinds = SPLIT_KINDS
    calibrate_on = "blk"  # (leaves ffn_down on f16: the probe reads its f16 input)
    scratch_parts = (*BlkPath.scratch_parts, "blk split scratch")

    @property
    def parity_cases(self) -> tuple[str, ...]:
        return BLK.parity_cases  # the forms of its blk routes (the split one: f32, acc)

    def memory(self, units, T: int, sms: int) -> tuple[dict, dict]:
        """blk's, and the Xo scratch at the largest K (weight_extra: the Wo bytes)."""
        w, s = super().memory(units, T, sms)
        K = max(u[1] for u in units)
        return w, {**s, "blk split scratch": SPLIT_OPERAND.nbytes(T, K)}

    def weight_grid(self, name: str, choice=None):
        """A split weight: OutlierGrid over blk's with its channels (the choice's, else the
        uncalibrated ones the upload takes); the rest blk's."""
        if not splits(name):
            return self.grid
        from minfer.cuda.paths.blk.outliers import OutlierGrid

        chans = (getattr(choice, "channels", None) or {}).get(name)
        known = {} if chans is None else {name: np.asarray(chans, np.int32)}
        return OutlierGrid(self.grid, known, fallback=default_cols)

    def kept_channels(self, mean_square):
        """busiest: the split_n(K) channels of the largest mean square."""
        from minfer.cuda.paths.blk.outliers import busiest

        return busiest(mean_square, split_n(int(np.size(mean_square))))

    def weight_extra(self, name: str, N: int, K: int) -> dict:
        return {"blk split f16 columns": N * split_n(K) * 2} if splits(name) else {}

    def route(self, qtype: int, choice, name: str = ""):
        if splits(name):
            return SplitRoute(self, qtype, choice, name)
        return BlkRoute(self, qtype, choice, name)

    def upload(self, rt, up, parts, name: str, dst=None, glu: bool = False):
        if len(parts) == 1 and splits(name):
            return upload_split(rt, up, parts, name)
        return super().upload(rt, up, parts, name, dst, glu)

    def twin(self, x, w_raw, qtype: int, M: int, N: int, K: int, name: str = ""):
        """split_linear_ref on the uncalibrated channels for split weights (as `upload`
        without GemmChoice.channels), blk's twin for the rest."""
        if not splits(name):
            return super().twin(x, w_raw, qtype, M, N, K, name)
        from minfer.cuda.ops.dequant import dequant_f16_ref

        x = np.asarray(x, np.float32).reshape(M, K)
        return split_linear_ref(x, dequant_f16_ref(w_raw, qtype, N, K), default_cols(K))

    def load_kernels(self):
        from minfer.cuda.paths.blk.split import KERNEL

        return super().load_kernels() + [(KERNEL, ())]


BLK_SPLIT = BlkSplitPath(
    "blk-split",
    BLK.kernel,
    None,
    BLK.archs,
    BLK.k_multiple,
    {None: 16896 / 16384},
    variants=("glu", "stream-k", "fused-prepass", "token-scale"),
    gemv_f16=True,
    experts=BLK.experts,
)
