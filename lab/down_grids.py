"""ffn_down grids a Hopper kernel could run, beyond blk's and FP8's (blk/twin.py, blk/fp8.py),
measured through gate 6 on the CPU emulation (docs/perplexity.md, "ffn_down off f16"; none
passes, so the product ships none): `minfer perplexity --emulate blk-fp8down` with ffn_down's
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
    return {n: (z[n + "|x"], z[n + "|w"]) for n in names}


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
            xmax, wmax = self._stats[name]
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
)


def outlier_layers(stats, n: int) -> set[str]:
    """The n ffn_down weights whose inputs' largest |X_j| (the calibration's) stands furthest
    above their median channel's: the massive-activation layers (SmolLM2: 11 and 28)."""
    st = stats if isinstance(stats, dict) else load_smooth_stats(stats)
    ratio = {k: float(x.max() / max(np.median(x), 1e-30)) for k, (x, _) in st.items()}
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
