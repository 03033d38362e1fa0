"""The blk path's activation grid with one scale per token (over all its 128-blocks) instead of
one per (token, 128), which spares the kernel's fold its FMUL (z = fma(i2f(S), sw, z), sa applied
once in the epilogue). Which GEMM inputs take it is the variant; the rest get one scale per
(token, 128). An experiment: `minfer perplexity --emulate blk` with blk_ref.token_scaled (the
kernel's choice: "norm") patched for the one process.

    python3 scripts/blk_agrid.py VARIANT -m M --emulate blk -t 1 --kld-base BASE.logits

| variant | per-token activation scale on |
| --- | --- |
| none | nothing (every input per (token, 128): the grid before per-token scales) |
| attn | attn_q, attn_k, attn_v (the attention norm's output) |
| ffn | ffn_gate, ffn_up (the ffn norm's output) |
| norm | the rmsnorm-fed GEMMs (attn_q, attn_k, attn_v, ffn_gate, ffn_up: the norm launch holds the whole row) |
| norm+attn | those and attn_output |
| all | every blk GEMM |
"""

from __future__ import annotations

import sys

from minfer.quants import blk_ref

GROUPS = {
    "none": (),
    "attn": ("attn_q", "attn_k", "attn_v"),
    "ffn": ("ffn_gate", "ffn_up"),
    "norm": ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"),
    "norm+attn": ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "attn_output"),
    "all": ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "attn_output", "ffn_down"),
}


def patch(variant: str) -> None:
    """Route blk_ref.token_scaled (which the CPU reference asks per weight) through `variant`."""
    kinds = GROUPS[variant]
    blk_ref.token_scaled = lambda name: name.split(".")[-2] in kinds


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in GROUPS:
        sys.exit(f"usage: blk_agrid.py {{{','.join(GROUPS)}}} PERPLEXITY-OPTIONS...")
    patch(sys.argv[1])
    from minfer.cli import main as cli

    sys.argv = ["minfer", "perplexity", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
