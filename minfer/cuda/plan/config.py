"""GemmChoice: the user's GEMM choice, resolved once from `--gemm` or the environment; the
per-weight path is then minfer.cuda.paths.choose_path's (docs/paths.md).

Precedence: `--gemm NAME`, then MINFER_GEMM=NAME, else "auto". NAME: auto, f16, mmq or a path of
minfer.cuda.paths.TABLE; "mmq" is the seeds' config, the wide kernel at KD = 4 (`wide-kd4`).
A tuning variant ("f16:no-rope", "blk:no-glu:no-stream-k") turns off an epilogue or scheduling
feature the code otherwise decides; only `bench --ab` takes them. `gemm_choice` below is the
one function that reads the process environment for it (the CLI's flags and minfer.Engine
call it); everywhere else the dataclass is passed explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from minfer.cuda.paths import CHOICES, TABLE, VARIANTS
from minfer.errors import BadInput

ENV_KEYS = ("MINFER_GEMM",)


@dataclass(frozen=True)
class GemmChoice:
    path: str = "auto"  # "auto" or a TABLE name
    off: frozenset = frozenset()  # features turned off by a tuning variant
    # weight -> its input channels kept on f16 (blk-split's calibration; the weight upload
    # reads them: Staging.channels); not part of the choice's identity
    channels: Mapping | None = field(default=None, compare=False, hash=False, repr=False)

    def on(self, feature: str) -> bool:
        return feature not in self.off

    def label(self) -> str:
        return self.path + "".join(f":no-{f}" for f in sorted(self.off))

    @classmethod
    def resolve(
        cls, env: Mapping[str, str], gemm: str | None = None, variants: bool = False
    ) -> "GemmChoice":
        """From `gemm` (the --gemm value), else env's MINFER_GEMM.
        variants: accept "name:no-feature" tuning variants (bench --ab)."""
        retired = sorted(k for k in env if k.startswith("MINFER_MMQ"))
        if retired and not gemm and not env.get("MINFER_GEMM"):  # never silently auto
            raise BadInput(
                f"{retired[0]} is no longer read: MINFER_GEMM (or --gemm) names the path "
                "(MINFER_MMQ=0 -> f16, MINFER_MMQ=1 -> mmq, MINFER_MMQ_RAW_KD=8 -> wide-kd8, "
                "MINFER_MMQ_RAW_WIDE=0 -> narrow, MINFER_MMQ_RAW=0 -> r1; docs/paths.md)"
            )
        spec = gemm or env.get("MINFER_GEMM") or ""
        name, *offs = (spec or "auto").strip().split(":")
        if offs and not variants:
            raise BadInput(
                f"GEMM choice {spec!r}: tuning variants are for bench --ab; "
                f"choose one of {', '.join(CHOICES)}"
            )
        if name not in CHOICES:
            raise BadInput(f"unknown GEMM path {name!r} (choose one of {', '.join(CHOICES)})")
        if name == "mmq":
            name = "wide-kd4"
        off = set()
        for o in offs:
            f = o[3:] if o.startswith("no-") else ""
            ok = VARIANTS if name == "auto" else TABLE[name].variants
            if f not in ok:
                raise BadInput(
                    f"tuning variant {o!r} of {name}: expected one of "
                    f"{', '.join('no-' + v for v in ok) or '(none)'}"
                )
            off.add(f)
        return cls(name, frozenset(off))

    @classmethod
    def parse_ab(cls, spec: str, env: Mapping[str, str], gemm: str | None = None) -> "GemmChoice":
        """A bench --ab config over `gemm` (the --gemm value) over the environment: a path
        name with tuning variants ('f16:no-rope', 'blk', 'wide-kd8') or MINFER_GEMM=NAME; '' is
        --gemm's choice, else the environment's."""
        env = dict(env)
        if gemm is not None:
            env["MINFER_GEMM"] = gemm  # --gemm over the environment; the spec over both
        name = None
        for tok in spec.split():
            if "=" not in tok:
                if name is not None:
                    raise BadInput(f"--ab {spec!r}: two path names")
                name = tok
                continue
            k, v = tok.split("=", 1)
            if k not in ENV_KEYS:
                raise BadInput(f"--ab: unknown key {k!r} (known: {', '.join(ENV_KEYS)})")
            env[k] = v
        return cls.resolve(env, name, variants=True)


def gemm_choice(
    gemm: str | None = None, ab: str | None = None, env: Mapping[str, str] | None = None
) -> GemmChoice:
    """The GemmChoice of --gemm, else the environment (MINFER_GEMM),
    else auto; with `ab` (a bench --ab config, tuning variants allowed) that config over both.
    env: the process environment unless given (tests). The one function that reads the GEMM
    environment: the CLI's flags (commands.gemm_flags) and minfer.Engine both call it."""
    import os

    env = os.environ if env is None else env
    if ab is not None:
        return GemmChoice.parse_ab(ab, env, gemm)
    return GemmChoice.resolve(env, gemm)


def moe_kernel(env: Mapping[str, str] | None = None) -> str:
    """The MoE grouped GEMMs' kernel: MINFER_MOE_GEMM (mma, the default: the dense f16 path's
    tile; wmma: moe.cu's simple control kernel), read here with the GEMM choice."""
    import os

    from minfer.cuda.ops.moe import KERNELS

    v = (os.environ if env is None else env).get("MINFER_MOE_GEMM", "mma").strip().lower()
    if v not in KERNELS:
        raise BadInput(f"MINFER_MOE_GEMM={v!r}: expected one of {', '.join(KERNELS)}")
    return v
