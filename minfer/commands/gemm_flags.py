"""The GEMM choice option of `minfer prefill`, `minfer bench` and `minfer check`.

    @gemm_options               # adds --gemm auto|f16|mmq|<a path of minfer.cuda.paths.TABLE>
    def cmd(..., gemm): ...
    choice = gemm_choice(gemm)  # --gemm, else MINFER_GEMM, else auto

gemm_choice (minfer.cuda.plan.config's, the one place the GEMM choice is read from the
environment: prefill, perplexity, bench, check, and minfer.Engine) resolves --gemm; everything
below takes the GemmChoice it returns.

Not a command module (minfer.cli lists those).
"""

from __future__ import annotations

import click

from minfer.cuda.paths import CHOICES
from minfer.cuda.plan.config import gemm_choice  # the one reader of the environment
from minfer.errors import BadInput

__all__ = ["HELP", "gemm_options", "gemm_choice", "check_gemm_backend"]

HELP = (
    "GEMM path: auto (default: on sm_90 from d_model 4096 the int8 blk path, lossy and "
    "gate-checked; else f16 where the model fits the GPU, then the smaller int8 paths), "
    "f16 (exact), mmq (the seeds' config: wide-kd4) or a path "
    "by name (docs/paths.md; MINFER_GEMM)."
)


def gemm_options(f):
    """Decorator: --gemm, None unless given."""
    return click.option("--gemm", "gemm", type=click.Choice(CHOICES), default=None, help=HELP)(f)


def check_gemm_backend(kind: str, gemm: str | None, configs=(), why: str = "") -> None:
    """BadInput (exit 2) when --gemm or a bench --ab config names a GPU path and the backend
    is the CPU reference, which has no GEMM paths: running it anyway would print the CPU's
    figures under the path's name (two rows of one CPU run reported as an A/B)."""
    if kind != "cpu":
        return
    asked = [f"--gemm {gemm}"] if gemm not in (None, "auto") else []
    asked += [f"--ab {c!r}" for c in configs if c.strip()]
    if asked:
        how = f" ({why})" if why else ""
        raise BadInput(
            f"{asked[0]}: a GPU GEMM path, and the backend is cpu{how}, the numpy "
            "reference, which has none; run it with --backend cuda on a GPU, or "
            "leave it out"
        )
