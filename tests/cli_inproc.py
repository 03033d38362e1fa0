"""Run `minfer ...` in this process (minfer.cli.main) and collect exit code, stdout, stderr.

Fast enough for hundreds of cases (no interpreter start-up), and it goes through the same
error handling as the console script: a MinferError is one `error:` line and its exit code.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout


def run_cli(args: list[str]) -> tuple[int, str, str]:
    from minfer.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]
