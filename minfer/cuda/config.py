"""GemmConfig: which GEMM path the CUDA backend takes, resolved once from env + overrides.

MINFER_MMQ (0: f16 path, 1: MMQ), MINFER_MMQ_RAW (0: R1 word-level kernel), MINFER_MMQ_RAW_WIDE
(0: narrow raw kernel), MINFER_MMQ_RAW_KD (4 or 8), MINFER_MMQ_WGMMA (1, the default: q4_K and q6_K GEMMs
of the wide config run on the Hopper wgmma kernels where the GPU is sm_90; 0: the mma.sync wide
kernel everywhere), MINFER_MMQ_WGMMA_Q6K (1, the default; 0: q6_K stays on the mma.sync wide
kernel while q4_K takes wgmma, the A/B of the q6_K kernel), MINFER_MMQ_STREAMK (1, the default:
the wgmma kernels split the tiles of a ragged last wave by k over every SM; 0: whole tiles),
MINFER_MMQ_FUSED_PREPASS (1, the default: a wgmma ffn_down's input is quantized by the swiglu
launch itself, no f16 activation; 0: swiglu, then the prepass), MINFER_MMQ_SB (0, the default;
1: q4_K / q6_K GEMMs of the wgmma config run the super-block kernels, kernels/mmq_sb_q4k.cu and
mmq_sb_q6k.cu, whose activations are quantized per 256 values instead of q8_1's 32),
MINFER_MMQ_Q6K_F16 (0, the default; 1: q6_K GEMMs stay on the f16 path while q4_K runs MMQ:
at prefill sizes on sm_90 every q6_K MMQ kernel is slower than f16, docs/perf.md),
MINFER_MMQ_SB_GLU (1, the default: a q4_K gate|up GEMM on the SB kernel writes silu(gate) * up
as f16 from its epilogue, its weight rows interleaved at load; 0: it writes the f32 [M, 2F]
and a swiglu launch follows), MINFER_F16_GLU (1, the default: a gate|up GEMM on the f16 path
writes silu(gate) * up as f16 from its epilogue, its weight rows interleaved at load, as the SB
kernel's; 0: it writes the f32 [M, 2F] and a swiglu launch follows), MINFER_F16_ROPE (1, the
default: a fused q|k|v GEMM on the f16 path writes roped q and the K/V cache rows as f16 from
its epilogue, for llama-order rope and prefill chunks whose GEMM tiles fit one wave,
gemm.rope_epilogue_pays; 0: it writes the f32 [M, N] and a rope launch follows).
Explicit overrides (CLI flags, bench A/B strings) win over the environment. The dataclass is passed explicitly; nothing reads the
environment after `GemmConfig.resolve`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Mapping

from minfer.errors import BadInput

ENV_KEYS = {"MINFER_MMQ": "mmq", "MINFER_MMQ_RAW": "raw", "MINFER_MMQ_RAW_WIDE": "wide",
            "MINFER_MMQ_RAW_KD": "kd", "MINFER_MMQ_WGMMA": "wgmma",
            "MINFER_MMQ_WGMMA_Q6K": "wgmma_q6k", "MINFER_MMQ_STREAMK": "stream_k",
            "MINFER_MMQ_FUSED_PREPASS": "fused_prepass", "MINFER_MMQ_SB": "sb",
            "MINFER_MMQ_Q6K_F16": "q6k_f16", "MINFER_MMQ_SB_GLU": "sb_glu",
            "MINFER_F16_GLU": "f16_glu", "MINFER_F16_ROPE": "f16_rope"}


@dataclass(frozen=True)
class GemmConfig:
    mmq: bool = False
    raw: bool = True
    wide: bool = True
    kd: int = 4
    wgmma: bool = True
    wgmma_q6k: bool = True
    stream_k: bool = True
    fused_prepass: bool = True
    sb: bool = False
    q6k_f16: bool = False
    sb_glu: bool = True
    f16_glu: bool = True
    f16_rope: bool = True

    @classmethod
    def resolve(cls, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, str | int | bool] | None = None) -> "GemmConfig":
        """From `env` (default os.environ), then `overrides` (keys MINFER_* or field names)."""
        env = os.environ if env is None else env
        vals: dict[str, object] = {}
        for key, field in ENV_KEYS.items():
            if key in env and env[key] != "":
                vals[field] = _parse(key, env[key])
        for key, v in (overrides or {}).items():
            field = ENV_KEYS.get(key, key)
            if field not in {f.name for f in fields(cls)}:
                raise BadInput(f"unknown GEMM config key {key!r} (known: {', '.join(ENV_KEYS)})")
            vals[field] = _parse(key, v)
        cfg = cls(**vals)
        if cfg.kd not in (4, 8):
            raise BadInput(f"MINFER_MMQ_RAW_KD must be 4 or 8, not {cfg.kd}")
        return cfg

    @classmethod
    def parse_ab(cls, spec: str, env: Mapping[str, str] | None = None) -> "GemmConfig":
        """'MINFER_MMQ=1 MINFER_MMQ_RAW_KD=8' -> GemmConfig (over the environment)."""
        overrides: dict[str, str] = {}
        for tok in spec.split():
            if "=" not in tok:
                raise BadInput(f"--ab: {tok!r} is not KEY=VALUE")
            k, v = tok.split("=", 1)
            if k not in ENV_KEYS:
                raise BadInput(f"--ab: unknown key {k!r} (known: {', '.join(ENV_KEYS)})")
            overrides[k] = v
        return cls.resolve(env, overrides)

    def label(self) -> str:
        if not self.mmq:
            return "f16" + ("" if self.f16_glu else "-noglu") + ("" if self.f16_rope else "-norope")
        if not self.raw:
            return "mmq-r1"
        if not self.wide:
            return f"mmq-narrow-kd{self.kd}"
        sk = ("" if self.stream_k or not self.wgmma else "-nosk") + \
            ("" if self.fused_prepass or not self.wgmma else "-nofp")
        sk += ("-sb" + ("" if self.sb_glu else "-noglu")) if self.sb and self.wgmma else ""
        sk += "-q6kf16" if self.q6k_f16 else ""
        if self.wgmma and not self.wgmma_q6k:
            return f"mmq-wgmma-q4k-kd{self.kd}{sk}"
        return f"mmq-{'wgmma' if self.wgmma else 'wide'}-kd{self.kd}{sk}"


def _parse(key: str, v) -> object:
    field = ENV_KEYS.get(key, key)
    s = str(v).strip().lower()
    if field == "kd":
        try:
            return int(s)
        except ValueError:
            raise BadInput(f"{key}={v!r}: expected 4 or 8") from None
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise BadInput(f"{key}={v!r}: expected 0 or 1")
