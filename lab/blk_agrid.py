"""The blk path's activation grid with one scale per token (the max over all its rotated blocks)
instead of one per (token, 128): the kernel's fold would lose its FMUL (z = fma(i2f(S), sw, z),
the token's scale applied once before the epilogue). An experiment: `minfer perplexity --emulate
blk` with the CPU reference's blk GEMMs of some weight kinds patched for the one process.

    python3 lab/blk_agrid.py GROUP[:rotR|:gain] -m M --emulate blk -t 1 --kld-base BASE

GROUP: which GEMM inputs take per-token scales (the others keep the kernel's grid):

| group | weight kinds |
| --- | --- |
| attn | attn_q, attn_k, attn_v (the attention norm's output) |
| ffn | ffn_gate, ffn_up (the ffn norm's output) |
| norm | both: every GEMM after an rmsnorm (whose launch holds the whole row) |
| all | norm and attn_output, ffn_down |
| out | attn_output on top of what ships: blk_ref.TOKEN_SCALED extended, so the reference's own blk emulation (weights per (row, pair of blocks)) reads its input per token |

`:rot256` / `:rot512`: those GEMMs' operands rotated by a 256- / 512-point transform (the tail
past the last whole one per 128), weight scales still per (row, 128). `:gain`: the norm's gain g
moved into the weight (x' = x / g, W' = W diag(g)).

Measured 2026-12-02, the Q4_K_M requant of SmolLM2, gnu-gpl.txt, ctx 512, base the exact CPU
forward; gate 6: KLD <= 0.003, top-1 >= 96.61 % (8 windows) / 96.56 % (22):

| grid | windows | mean KLD | same top-1 % |
| --- | ---: | --- | --- |
| the kernel's (every input per (token, 128)) | 8 | 0.002248 | 97.79 |
| norm | 8 | 0.002684 +/- 0.000067 | 97.45 +/- 0.35 |
| all | 8 | 0.003093 +/- 0.000073 | 96.91 +/- 0.38 |
| norm, Q4_1 (kernel's grid: 0.002038, 97.89) | 8 | 0.002424 +/- 0.000053 | 97.25 +/- 0.36 |
| the kernel's | 22 | 0.002777 | 97.50 |
| attn | 22 | 0.003004 +/- 0.000089 | 97.06 +/- 0.23 |
| ffn | 22 | 0.003097 +/- 0.000068 | 97.15 +/- 0.22 |
| norm | 22 | 0.003277 +/- 0.000079 | 96.90 +/- 0.23 |
| norm:rot256 | 22 | 0.003432 +/- 0.000076 | 96.72 +/- 0.24 |
| norm:rot512 | 22 | 0.003889 +/- 0.000093 | 96.58 +/- 0.24 |
| norm:gain | 22 | 0.005422 +/- 0.000124 | 95.99 +/- 0.26 |

`out`, 2026-12-06, Q4_K_M, 22 windows: 0.002885 +/- 0.000077, 97.24 +/- 0.22 % (what ships:
0.002693, 97.29 %): inside the gate by 0.000115. Not shipped: the attention writes one head's
block at a time, so a per-token scale needs a second pass over its output (docs/blk.md).

Over the whole text no per-token grid keeps mean KLD <= 0.003 while ffn_down takes the int8
grid. With ffn_down on f16 the `norm` grid measures 0.002565 / 97.08 % (22 windows), and that
is what ships, with a weight scale per pair of blocks (docs/blk.md, "Quality"): the reference
now emulates it itself (blk_ref.token_scaled), so here `norm` changes nothing at 128 points.
"""

from __future__ import annotations

import sys

import numpy as np

GROUPS = {
    "attn": ("attn_q", "attn_k", "attn_v"),
    "ffn": ("ffn_gate", "ffn_up"),
    "norm": ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"),
    "all": ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "attn_output", "ffn_down"),
}
NORM = {
    "attn_q": "attn_norm",
    "attn_k": "attn_norm",
    "attn_v": "attn_norm",
    "ffn_gate": "ffn_norm",
    "ffn_up": "ffn_norm",
}


def grid(x: np.ndarray, weight: bool, rot: int = 128) -> np.ndarray:
    """x [n, K] -> f32 [n, K]: its values on the grid, rotated back. The columns in whole
    `rot`-point chunks are rotated by `rot` points, the rest per 128 (zero-padded); then int8,
    one scale per (row, 128) for a weight, per row (over all blocks) for activations."""
    from minfer.cuda.paths.blk.twin import fwht128

    x = np.asarray(x, np.float16).astype(np.float32)
    n, K = x.shape
    full = K // rot * rot
    parts = [fwht128(x[:, :full].reshape(n, -1, rot), rot).reshape(n, -1, 128)] if full else []
    if K > full:
        tail = np.zeros((n, -(-(K - full) // 128) * 128), np.float32)
        tail[:, : K - full] = x[:, full:]
        parts.append(fwht128(tail.reshape(n, -1, 128)))
    y = np.concatenate(parts, axis=1)  # [n, blocks, 128]
    amax = np.abs(y).max(axis=-1 if weight else (1, 2), keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    yq = np.clip(np.rint(y * inv), -127, 127) * (amax / np.float32(127))
    nb = full // 128
    out = (
        [(fwht128(yq[:, :nb].reshape(n, -1, rot), rot) / np.float32(rot)).reshape(n, -1)]
        if full
        else []
    )
    if K > full:
        out.append((fwht128(yq[:, nb:]) / np.float32(128)).reshape(n, -1)[:, : K - full])
    return np.ascontiguousarray(np.concatenate(out, axis=1))


def patch(spec: str) -> None:
    """Route the reference's blk GEMMs of `spec`'s group through its grids."""
    from minfer.reference.forward import ReferenceBackend

    group, _, opt = spec.partition(":")
    kinds, rot = GROUPS[group], int(opt[3:]) if opt.startswith("rot") else 128
    weight0, linear0 = ReferenceBackend.weight, ReferenceBackend._linear

    def ours(be, name):
        return name in be.grids and name.split(".")[-2] in kinds

    def gain(be, name):  # the gain of the norm before this GEMM (opt "gain")
        il, kind = name.split(".")[1], name.split(".")[-2]
        return be.model.dequant(f"blk.{il}.{NORM[kind]}.weight").reshape(-1).astype(np.float32)

    def weight(be, name):
        if ours(be, name) and name not in be._w:
            w = be.model.dequant(name)
            w = w.reshape(w.shape[0], -1) * (gain(be, name) if opt == "gain" else 1)
            be._w[name] = grid(w, True, rot).astype(be.dtype)
        return weight0(be, name)

    def _linear(be, x, name):
        if not ours(be, name):
            return linear0(be, x, name)
        if opt == "gain":
            g = gain(be, name)
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.where(g != 0, x / g, 0)
        x = grid(x.reshape(-1, x.shape[-1]), False, rot).reshape(x.shape)
        return x.astype(be.dtype) @ weight(be, name).T  # (llama's linears: no bias)

    ReferenceBackend.weight, ReferenceBackend._linear = weight, _linear


def token_scale_out() -> None:
    """Group `out`: the shipped grid, attn_output's input per token too (the reference's own
    blk emulation reads blk_ref.TOKEN_SCALED)."""
    import minfer.cuda.paths.blk.twin as blk_ref

    blk_ref.TOKEN_SCALED = blk_ref.TOKEN_SCALED + ("attn_output",)


def main() -> None:
    group, _, opt = (sys.argv[1] if len(sys.argv) > 1 else "").partition(":")
    if group == "out" and not opt:
        token_scale_out()
    elif (
        group not in GROUPS
        or opt not in ("", "rot256", "rot512", "gain")
        or (opt == "gain" and group == "all")
    ):  # (gain: the GEMMs after a norm only)
        sys.exit(
            f"usage: blk_agrid.py {{{','.join(GROUPS)}}}[:rot256|:rot512|:gain] | out "
            "PERPLEXITY-OPTIONS..."
        )
    else:
        patch(sys.argv[1])
    from minfer.cli import main as cli

    sys.argv = ["minfer", "perplexity", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
