"""GemmChoice: the user's GEMM choice, resolved once from `--gemm`, the environment and the seeds'
variables; the per-weight path is then minfer.cuda.paths.choose_path's (docs/paths.md).

Precedence: `--gemm NAME`, then MINFER_GEMM=NAME, then the seeds' MINFER_MMQ (0: f16, 1: the
seeds' MMQ config), else "auto". NAME: auto, f16, mmq or a path of minfer.cuda.paths.TABLE.
"mmq" is the seeds' config: the wide kernel at KD = MINFER_MMQ_RAW_KD (4 unless set to 8),
MINFER_MMQ_RAW_WIDE=0 the narrow kernel, MINFER_MMQ_RAW=0 the R1 kernel.
A tuning variant ("f16:no-rope", "blk:no-glu:no-stream-k") turns off an epilogue or scheduling
feature the code otherwise decides; only `bench --ab` takes them. The environment is an
argument here: the one function that reads the process environment for it is the CLI's
(minfer.commands.gemm_flags.gemm_choice); below it the dataclass is passed explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from minfer.cuda.paths import CHOICES, TABLE, VARIANTS
from minfer.errors import BadInput

SEED_KEYS = ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_WIDE", "MINFER_MMQ_RAW_KD")
ENV_KEYS = ("MINFER_GEMM", *SEED_KEYS)


@dataclass(frozen=True)
class GemmChoice:
    path: str = "auto"  # "auto" or a TABLE name
    off: frozenset = frozenset()  # features turned off by a tuning variant

    def on(self, feature: str) -> bool:
        return feature not in self.off

    def label(self) -> str:
        return self.path + "".join(f":no-{f}" for f in sorted(self.off))

    @classmethod
    def resolve(
        cls, env: Mapping[str, str], gemm: str | None = None, variants: bool = False
    ) -> "GemmChoice":
        """From `gemm` (the --gemm value), else env (MINFER_GEMM, the seeds' variables).
        variants: accept "name:no-feature" tuning variants (bench --ab)."""
        spec = gemm or env.get("MINFER_GEMM") or ""
        if not spec and env.get("MINFER_MMQ", "") != "":
            spec = "mmq" if _flag("MINFER_MMQ", env["MINFER_MMQ"]) else "f16"
        name, *offs = (spec or "auto").strip().split(":")
        if offs and not variants:
            raise BadInput(
                f"GEMM choice {spec!r}: tuning variants are for bench --ab; "
                f"choose one of {', '.join(CHOICES)}"
            )
        if name not in CHOICES:
            raise BadInput(f"unknown GEMM path {name!r} (choose one of {', '.join(CHOICES)})")
        seeds = seeds_mmq(env)  # validated whenever set
        if name == "mmq":
            name = seeds
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
        name with tuning variants ('f16:no-rope', 'blk', 'wide-kd8') and / or KEY=VALUE of
        MINFER_GEMM and the seeds' variables ('MINFER_MMQ=1 MINFER_MMQ_RAW_KD=8'); '' is
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
            if k in SEED_KEYS and "MINFER_GEMM" not in spec:
                env.pop("MINFER_GEMM", None)  # the spec's seeds' keys win over the env's
        return cls.resolve(env, name, variants=True)


def seeds_mmq(env: Mapping[str, str]) -> str:
    """The path the seeds' MINFER_MMQ=1 runs: R1 (MINFER_MMQ_RAW=0), narrow
    (MINFER_MMQ_RAW_WIDE=0), else wide at MINFER_MMQ_RAW_KD (4 or 8, default 4)."""
    if env.get("MINFER_MMQ_RAW", "") != "" and not _flag("MINFER_MMQ_RAW", env["MINFER_MMQ_RAW"]):
        return "r1"
    if env.get("MINFER_MMQ_RAW_WIDE", "") != "" and not _flag(
        "MINFER_MMQ_RAW_WIDE", env["MINFER_MMQ_RAW_WIDE"]
    ):
        return "narrow"
    kd = str(env.get("MINFER_MMQ_RAW_KD") or "4").strip()
    if kd not in ("4", "8"):
        raise BadInput(f"MINFER_MMQ_RAW_KD must be 4 or 8, not {kd!r}")
    return f"wide-kd{kd}"


def _flag(key: str, v) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise BadInput(f"{key}={v!r}: expected 0 or 1")
