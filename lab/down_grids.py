"""ffn_down grids a Hopper kernel could run, beyond blk's and FP8's (blk/twin.py, blk/fp8.py),
measured through gate 6 on the CPU emulation (docs/perplexity.md, "ffn_down off f16"; of these
only the outlier splits pass, shipped as `--emulate blk-int8down`, no kernel yet): `minfer perplexity --emulate blk-fp8down` with ffn_down's
grid replaced by VARIANT's, blk's grid on the other weights. An experiment: it patches
minfer.tools.perplexity.emulate.emulated_grids for the one process.

    python3 lab/down_grids.py VARIANT [--stats FILE] -m M --emulate blk-fp8down -t 1 --kld-base B

| variant | ffn_down's grid |
| --- | --- |
| fp8-a32 | FP8 e4m3, activations per (token, 32), weights per (row, 128) |
| fp8-32 | FP8 e4m3 per (token, 32) and (row, 32) |
| int8 | blk's rotated int8 (the grid of blk's tuning variant `no-exact-down`) |
| int8-a32 | blk's int8 with activation scales per 32 of the rotated 128 |
| sq-int8, sq75-int8 | SmoothQuant's migration (a = 0.5, 0.75; --stats), then blk's int8 |
| sq-int8-a32 | SmoothQuant, then int8-a32 |
| sq-int8-w128 | SmoothQuant, then blk's int8 with the weight per (row, 128) |
| sq30-, sq40-int8-w128 | the same with a = 0.3, 0.4 |
| any of them + `-skipN` | the N layers whose ffn_down input has the largest max-to-median channel ratio (--stats) keep ffn_down exact |
| sq-fp8 | SmoothQuant, then FP8 per 128 x 128 |
| int8-actonly, int8-weightonly | blk's int8 on one operand, the other exact: which side costs |
| rot512, rot512s, sq-rot512[s] | int8 after a 512-point rotation (s: random signs first, QuaRot's) |
| int8-o8 ... int8-o128, int8-w128-o64 | the n channels of largest max abs X_j (--stats) exact on both sides (OutlierSplit: the package's OutlierGrid), int8 on the rest |
| int8-r32, int8-r64 | the same by mean square X_j^2 (the package's `--emulate blk-int8down` choice) |
| sq-int8-o8, sq-int8-o32, sq25-int8-o32 | SmoothQuant (a = 0.5, 0.25), then the outlier split |
| int8down-tok | `--emulate blk-int8down`'s split (128 channels by the package's calibration) with one activation scale per token on the rest: the fold-free kernel (mmq_blk_tok) |

- blk_sub_grid: blk's rotated int8 activations (128-point Walsh-Hadamard per 128 of K) with
  one scale per `sub` (32) of the rotated values instead of per 128: q = rint(y * 127 / amax)
  over each `sub` of the rotated block y, then rotated back. A kernel would fold per 32 of K
  (one wgmma k32 a fold). The weight keeps blk's grid (per (row, 256), rotated).
- SmoothQuant's migration (Xiao et al. 2022) before a grid: per input channel j of ffn_down,
  s_j = max|X_j|^a / max|W_j|^(1 - a) (a = 0.5), X' = X / s (a multiply a value in the operand
  prepass, or folded into ffn_up's rows), W' = W * s (at the requantization), then the grid
  on X' and W': X'^ W'^T ~= X W^T. max|X_j| from a calibration run over another text
  (lab/smooth_calib.py writes them), max|W_j| from the weight itself; both in the stats
  file (--stats), so act and weight need nothing else.
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda.paths.blk.outliers import OutlierGrid
from minfer.cuda.paths.blk.twin import BK, WPAIR, _rotated, blk_grid, fwht128, kblocks

ALPHA = 0.5


def blk_sub_grid(x: np.ndarray, sub: int = 32) -> np.ndarray:
    """x [R, K] (its f16 values) -> f32 [R, K]: blk's rotated int8 activation grid with one
    scale per `sub` of each rotated 128 (s = amax / 127, q = rint(y * (127 / amax))), the
    values rotated back (x_hat = q s H / 128)."""
    x = np.asarray(x)
    R, K = x.shape
    KB = kblocks(K)
    y = _rotated(x).reshape(R, KB * BK // sub, sub)
    amax = np.abs(y).max(axis=-1)
    s = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(y * inv[..., None]), -127, 127)
    g = (q * s[..., None]).astype(np.float32).reshape(R, KB, BK)
    back = fwht128(g) / np.float32(BK)
    return np.ascontiguousarray(back.reshape(R, KB * BK)[:, :K])


class BlkSubGrid:
    """ffn_down on blk's rotated int8 grid with activations per (token, `sub` of the rotated
    128) (128: blk's own), the weight per (row, `pair` x 128) (2: as blk ships)."""

    def __init__(self, sub: int = 32, pair: int = WPAIR):
        self.sub, self.pair = sub, pair
        self.name = (
            "blk" + (f"-a{sub}" if sub != BK else "") + (f"-w{pair * BK}" if pair != WPAIR else "")
        )

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return blk_grid(w.reshape(w.shape[0], -1), weight=True, pair=self.pair)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        return blk_sub_grid(x.reshape(-1, x.shape[-1]), self.sub).reshape(x.shape)


def _signs(K: int, seed: int) -> np.ndarray:
    """A fixed random +-1 per input channel (QuaRot's randomized Hadamard: D before H)."""
    return np.random.default_rng(seed).choice(np.float32([-1, 1]), K)


def rot_grid(x: np.ndarray, rot: int, group: int, signs=None) -> np.ndarray:
    """x [R, K] (its f16 values) -> f32 [R, K]: a Walsh-Hadamard rotation over each `rot` of K
    (after the +-1 `signs` when given), int8 with one scale per `group` of the rotated values
    (q = rint(y * 127 / amax), as blk's), rotated back."""
    x = np.asarray(x, np.float16).astype(np.float32)
    R, K = x.shape
    if signs is not None:
        x = x * signs
    KB = kblocks(K, rot)
    xp = np.zeros((R, KB * rot), np.float32)
    xp[:, :K] = x
    y = fwht128(xp.reshape(R, KB, rot), rot).reshape(R, -1, group)
    amax = np.abs(y).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(y * inv[..., None]), -127, 127)
    g = (q * (amax / np.float32(127))[..., None]).astype(np.float32).reshape(R, KB, rot)
    back = (fwht128(g, rot) / np.float32(rot)).reshape(R, KB * rot)[:, :K]
    return np.ascontiguousarray(back * signs if signs is not None else back)


class RotGrid:
    """int8 on both sides after a wider rotation (QuaRot's online Hadamard before down_proj):
    Walsh-Hadamard over each `rot` of K (blk: 128), activations per (token, 128), the weight per
    (row, 256) as blk's; `signs`: a random +-1 per channel first (the same on both sides)."""

    def __init__(self, rot: int = 512, signs: bool = False):
        self.rot, self.signs = rot, signs
        self.name = f"rot{rot}" + ("s" if signs else "")

    def _d(self, K: int):
        return _signs(K, 0) if self.signs else None

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        w = w.reshape(w.shape[0], -1)
        return rot_grid(w, self.rot, WPAIR * BK, self._d(w.shape[1]))

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        x2 = x.reshape(-1, x.shape[-1])
        return rot_grid(x2, self.rot, BK, self._d(x2.shape[1])).reshape(x.shape)


class OneSide:
    """`inner`'s grid on one side only (side "act" or "weight"), the other exact: which side's
    rounding the KLD comes from."""

    def __init__(self, inner, side: str):
        self.inner, self.side = inner, side
        self.name = f"{inner.name}-{side}only"

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        w = w.reshape(w.shape[0], -1)
        return self.inner.weight(w, name) if self.side == "weight" else w.astype(np.float32)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        return self.inner.act(x, name) if self.side == "act" else x.astype(np.float32)


class OutlierSplit(OutlierGrid):
    """The package's OutlierGrid (minfer/cuda/paths/blk/outliers.py) with each weight's kept
    channels chosen here from the --stats file: the `n` of the largest calibrated max |X_j|
    (by="max") or mean square (by="ms": the package's choice, `--emulate blk-int8down`)."""

    def __init__(self, inner, n: int, stats=None, by: str = "max"):
        super().__init__(inner, {}, n)
        self._stats, self.by = stats, by
        self.name = f"{inner.name}-{'o' if by == 'max' else 'r'}{n}"

    def cols(self, name: str, K: int | None = None) -> np.ndarray:
        o = self.channels.get(name)
        if o is None:
            if not isinstance(self._stats, dict):
                self._stats = load_smooth_stats(self._stats)
            key = self._stats[name][0 if self.by == "max" else 2]
            o = self.channels[name] = np.argsort(key)[::-1][: self.n].copy()
        return o


class TokGrid:
    """blk's grid with one activation scale per token (the GEMMs after an rmsnorm: mmq_blk_tok,
    whose fold runs once per pair of blocks), the weight as blk's."""

    name = "blk-tok"

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return blk_grid(w.reshape(w.shape[0], -1), weight=True)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        return blk_grid(x.reshape(-1, x.shape[-1]), per_token=True).reshape(x.shape)


def smooth_scales(xmax: np.ndarray, wmax: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Per input channel: s = xmax^a / wmax^(1 - a) (f32), 1 where either max is 0 (a dead
    channel: nothing to move), clamped to [2^-16, 2^16]."""
    xmax = np.asarray(xmax, np.float64)
    wmax = np.asarray(wmax, np.float64)
    ok = (xmax > 0) & (wmax > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(ok, xmax**alpha / wmax ** (1 - alpha), 1.0)
    return np.clip(s, 2.0**-16, 2.0**16).astype(np.float32)


def load_smooth_stats(path: str | None) -> dict:
    """weight name -> (xmax [K], wmax [K]) from the npz lab/smooth_calib.py writes (keys
    'NAME|x', 'NAME|w')."""
    import os

    from minfer.errors import BadInput

    if not path or not os.path.exists(path):
        raise BadInput(
            "the SmoothQuant variants need --stats FILE: the calibration stats of "
            "lab/smooth_calib.py (max |X_j| of ffn_down's input over another text)"
        )
    z = np.load(path)
    names = {k.rsplit("|", 1)[0] for k in z.files}
    ms = {n: z[n + "|x2"] / z[n + "|n"] if n + "|x2" in z.files else None for n in names}
    return {n: (z[n + "|x"], z[n + "|w"], ms[n]) for n in names}


class SmoothGrid:
    """SmoothQuant's migration, then `inner` (a grid: Fp8Grid, BlkGrid, ...): weight W * s,
    activation X / s, s = smooth_scales of the stats (a dict, or the npz path read on first
    use by load_smooth_stats)."""

    def __init__(self, inner, alpha: float = ALPHA, stats=None):
        self.inner, self.alpha, self._stats = inner, alpha, stats
        self._s: dict[str, np.ndarray] = {}
        self.name = ("sq-" if alpha == ALPHA else f"sq{round(alpha * 100)}-") + inner.name

    def scales(self, name: str) -> np.ndarray:
        s = self._s.get(name)
        if s is None:
            if not isinstance(self._stats, dict):
                self._stats = load_smooth_stats(self._stats)
            xmax, wmax = self._stats[name][:2]
            s = self._s[name] = smooth_scales(xmax, wmax, self.alpha)
        return s

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        w = w.reshape(w.shape[0], -1)
        return self.inner.weight((w * self.scales(name)).astype(np.float32), name)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        return self.inner.act((x / self.scales(name)).astype(np.float32), name)


def variant_grid(variant: str, stats=None):
    """The ffn_down grid of a VARIANTS name (stats: the SmoothQuant ones' npz path or dict)."""
    from minfer.cuda.paths.blk.fp8 import Fp8Grid
    from minfer.cuda.paths.blk.twin import BlkGrid

    return {
        "fp8-a32": lambda: Fp8Grid(ablock=32),
        "fp8-32": lambda: Fp8Grid(ablock=32, wblock=32),
        "int8": lambda: BlkGrid(),
        "int8-a32": lambda: BlkSubGrid(32),
        "sq-int8": lambda: SmoothGrid(BlkGrid(), stats=stats),
        "sq75-int8": lambda: SmoothGrid(BlkGrid(), alpha=0.75, stats=stats),
        "sq-int8-a32": lambda: SmoothGrid(BlkSubGrid(32), stats=stats),
        "sq-int8-w128": lambda: SmoothGrid(BlkSubGrid(128, pair=1), stats=stats),
        "sq30-int8-w128": lambda: SmoothGrid(BlkSubGrid(128, pair=1), alpha=0.3, stats=stats),
        "sq40-int8-w128": lambda: SmoothGrid(BlkSubGrid(128, pair=1), alpha=0.4, stats=stats),
        "sq-fp8": lambda: SmoothGrid(Fp8Grid(), stats=stats),
        "int8-actonly": lambda: OneSide(BlkGrid(), "act"),
        "int8-weightonly": lambda: OneSide(BlkGrid(), "weight"),
        "int8-o8": lambda: OutlierSplit(BlkGrid(), 8, stats),
        "int8-o32": lambda: OutlierSplit(BlkGrid(), 32, stats),
        "int8-o64": lambda: OutlierSplit(BlkGrid(), 64, stats),
        "int8-o128": lambda: OutlierSplit(BlkGrid(), 128, stats),
        "int8-r64": lambda: OutlierSplit(BlkGrid(), 64, stats, by="ms"),
        "int8-r32": lambda: OutlierSplit(BlkGrid(), 32, stats, by="ms"),
        "int8-w128-o64": lambda: OutlierSplit(BlkSubGrid(128, pair=1), 64, stats),
        "sq-int8-o8": lambda: OutlierSplit(SmoothGrid(BlkGrid(), stats=stats), 8, stats),
        "sq-int8-o32": lambda: OutlierSplit(SmoothGrid(BlkGrid(), stats=stats), 32, stats),
        "sq25-int8-o32": lambda: OutlierSplit(
            SmoothGrid(BlkGrid(), alpha=0.25, stats=stats), 32, stats
        ),
        "sq-int8-w128-o32": lambda: OutlierSplit(
            SmoothGrid(BlkSubGrid(128, pair=1), stats=stats), 32, stats
        ),
        "int8down-tok": lambda: OutlierGrid(TokGrid()),
        "rot512": lambda: RotGrid(512),
        "rot512s": lambda: RotGrid(512, signs=True),
        "sq-rot512": lambda: SmoothGrid(RotGrid(512), stats=stats),
        "sq-rot512s": lambda: SmoothGrid(RotGrid(512, signs=True), stats=stats),
    }[variant]()


VARIANTS = (
    "fp8-a32",
    "fp8-32",
    "int8",
    "int8-a32",
    "sq-int8",
    "sq75-int8",
    "sq-int8-a32",
    "sq-int8-w128",
    "sq30-int8-w128",
    "sq40-int8-w128",
    "sq-fp8",
    "int8-actonly",
    "int8-weightonly",
    "int8-o8",
    "int8-o32",
    "int8-o64",
    "int8-o128",
    "int8-r64",
    "int8-r32",
    "int8-w128-o64",
    "sq-int8-o8",
    "sq-int8-o32",
    "sq25-int8-o32",
    "sq-int8-w128-o32",
    "int8down-tok",
    "rot512",
    "rot512s",
    "sq-rot512",
    "sq-rot512s",
)


def outlier_layers(stats, n: int) -> set[str]:
    """The n ffn_down weights whose inputs' largest |X_j| (the calibration's) stands furthest
    above their median channel's: the massive-activation layers (SmolLM2: 11 and 28)."""
    st = stats if isinstance(stats, dict) else load_smooth_stats(stats)
    ratio = {k: float(v[0].max() / max(np.median(v[0]), 1e-30)) for k, v in st.items()}
    return set(sorted(ratio, key=ratio.get, reverse=True)[:n])


def patch(variant: str, stats=None) -> None:
    """ffn_down's grid of every --emulate label that has one replaced by the variant's; a
    "-skipN" suffix leaves the N outlier layers' ffn_down exact (f16 on the GPU)."""
    from minfer.tools.perplexity import emulate

    base, _, skip = variant.partition("-skip")
    orig = emulate.emulated_grids
    g = variant_grid(base, stats)
    keep = outlier_layers(stats, int(skip)) if skip else set()

    def emulated_grids(model, label):
        grids = orig(model, label)
        out = {n: (g if ".ffn_down." in n else v) for n, v in grids.items()}
        if type(g) is OutlierGrid:  # the package's split: its calibration binds the channels
            out = emulate._calibrated(model, out)
        return {n: v for n, v in out.items() if n not in keep}

    emulate.emulated_grids = emulated_grids


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0].partition("-skip")[0] not in VARIANTS:
        sys.exit(
            f"usage: down_grids.py {{{','.join(VARIANTS)}}} [--stats FILE] PERPLEXITY-OPTIONS..."
        )
    variant, rest, stats = args[0], args[1:], None
    if rest[:1] == ["--stats"]:
        stats, rest = rest[1], rest[2:]
    patch(variant, stats)
    from minfer.cli import main as cli

    sys.argv = ["minfer", "perplexity", *rest]
    cli()


if __name__ == "__main__":
    main()
