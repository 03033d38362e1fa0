"""Helpers of the perplexity tests: a short piece of the shipped text, and one
`minfer perplexity --json` run in process."""

from __future__ import annotations

import json

from cli_inproc import run_cli


def short_text(tmp_path_factory, nchars: int):
    """The shipped text's first `nchars` characters in a file (byte-level tokenizers: ~1 token
    per character)."""
    from minfer.tools.perplexity.windows import DEFAULT_TEXT

    p = tmp_path_factory.mktemp("text") / "t.txt"
    p.write_text(DEFAULT_TEXT.read_text()[:nchars])
    return p


def run_ppl(model, text, ctx: int, chunks: int, *extra) -> dict:
    """`minfer perplexity -m model -f text --ctx ctx --chunks chunks --json -t 1 extra...`'s
    JSON (the run must succeed)."""
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            str(model),
            "-f",
            str(text),
            "--ctx",
            str(ctx),
            "--chunks",
            str(chunks),
            "--json",
            "-t",
            "1",
            *extra,
        ]
    )
    assert code == 0, err
    return json.loads(out)
