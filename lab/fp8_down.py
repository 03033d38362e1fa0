"""Where FP8 e4m3 on ffn_down loses (docs/perplexity.md, "ffn_down off f16"): `minfer perplexity
--emulate blk-fp8down` with ffn_down's FP8 grid replaced by one of these variants (blk's grid
on its usual weights unless said). An experiment: this patches
minfer.tools.perplexity.emulate.emulated_grids for the one process.

    python3 lab/fp8_down.py VARIANT -m M --emulate blk-fp8down -t 1 --kld-base BASE.logits

| variant | ffn_down | the other GEMMs |
| --- | --- | --- |
| act | FP8 activations per (token, 128), the weight exact | blk |
| weight | FP8 weight per (row, 128), the activations exact | blk |
| rot | both FP8 after blk's 128-point Hadamard rotation (scales per 128 of the rotated values) | blk |
| alone | FP8 as blk-fp8down | exact |
| ao | f16 (as blk ships); attn_output on FP8 instead of blk's int8 | blk |
"""

from __future__ import annotations

import sys

import numpy as np

VARIANTS = ("act", "weight", "rot", "alone", "ao")


class _Half:
    """FP8 on one operand of ffn_down, the other exact."""

    def __init__(self, side: str):
        from minfer.cuda.paths.blk.fp8 import Fp8Grid

        self.side, self.fp8, self.name = side, Fp8Grid(), f"fp8-{side}"

    def weight(self, w, name):
        return self.fp8.weight(w, name) if self.side == "weight" else w

    def act(self, x, name):
        return self.fp8.act(x, name) if self.side == "act" else x


class _Rotated:
    """x -> H^T fp8(x H) / 128 per 128 of K (H the blk twin's unnormalized Walsh-Hadamard)."""

    name = "fp8-rot"

    def _grid(self, x):
        from minfer.cuda.paths.blk.fp8 import fp8_grid
        from minfer.cuda.paths.blk.twin import _rotated, fwht128

        R, K = x.shape
        y = _rotated(x).reshape(R, -1)  # [R, KB * 128], the f16 values rotated
        g = fp8_grid(y).reshape(R, -1, 128)
        return np.ascontiguousarray((fwht128(g) / np.float32(128)).reshape(R, -1)[:, :K])

    def weight(self, w, name):
        return self._grid(w.reshape(w.shape[0], -1))

    def act(self, x, name):
        return self._grid(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def patch(variant: str) -> None:
    from minfer.tools.perplexity import emulate

    orig = emulate.emulated_grids

    def emulated_grids(model, label):
        grids = orig(model, label)
        down = [n for n in grids if ".ffn_down." in n]
        if variant == "ao":  # (label blk-fp8down-ao: attn_output's grid is FP8 already)
            return {n: g for n, g in grids.items() if n not in down}
        if variant == "alone":
            return {n: grids[n] for n in down}
        g = _Rotated() if variant == "rot" else _Half(variant)
        return {**grids, **dict.fromkeys(down, g)}

    emulate.emulated_grids = emulated_grids


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in VARIANTS:
        sys.exit(f"usage: fp8_down.py {{{','.join(VARIANTS)}}} PERPLEXITY-OPTIONS...")
    patch(sys.argv[1])
    from minfer.cli import main as cli

    sys.argv = ["minfer", "perplexity", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
