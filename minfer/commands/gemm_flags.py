"""The GEMM choice option of `minfer prefill`, `minfer bench` and `minfer check`.

    @gemm_options               # adds --gemm auto|f16|mmq|<a path of minfer.cuda.paths.TABLE>
    def cmd(..., gemm): ...
    cfg = gemm_config(gemm=gemm)   # --gemm, else MINFER_GEMM, else the seeds' MINFER_MMQ, else auto

Not a command module (minfer.cli lists those).
"""

from __future__ import annotations

from typing import Mapping

import click

from minfer.cuda.paths import CHOICES

HELP = ("GEMM path: auto (default: on sm_90 from d_model 4096 the int8 blk path, lossy and "
        "gate-checked; else f16 where the model fits the GPU, then the smaller int8 paths), "
        "f16 (exact), mmq (the seeds' MINFER_MMQ_* config, wide KD=4 by default) or a path "
        "by name (docs/paths.md; MINFER_GEMM).")


def gemm_options(f):
    """Decorator: --gemm, None unless given."""
    return click.option("--gemm", "gemm", type=click.Choice(CHOICES), default=None,
                        help=HELP)(f)


def gemm_overrides(gemm: str | None = None) -> dict[str, str]:
    """The --gemm value as environment overrides ({} when not given)."""
    return {} if gemm is None else {"MINFER_GEMM": gemm}


def gemm_config(env: Mapping[str, str] | None = None, gemm: str | None = None):
    """GemmChoice from --gemm, else the environment."""
    from minfer.cuda.plan.config import GemmChoice

    return GemmChoice.resolve(env, gemm)
