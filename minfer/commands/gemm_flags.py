"""Shared GEMM-path CLI flags (`minfer prefill`, `minfer bench`): they mirror the environment.

    @gemm_options          # adds --mmq/--no-mmq, --mmq-raw/--no-mmq-raw, --mmq-wide/--no-mmq-wide,
    def cmd(..., **gemm): ...   # --mmq-kd 4|8, --mmq-wgmma/--no-.., --mmq-wgmma-q6k/--no-..,
                                # --mmq-stream-k/--no-.., --mmq-fused-prepass/--no-..,
                                # --mmq-sb/--no-mmq-sb, --mmq-q6k-f16/--no-..,
                                # --mmq-sb-glu/--no-mmq-sb-glu, --f16-glu/--no-f16-glu,
                                # --f16-rope/--no-f16-rope
                                # (one row of FLAGS each)
    cfg = gemm_config(**gemm)   # env, then flags (flags win)

An unset flag leaves the environment's value (MINFER_MMQ, MINFER_MMQ_RAW, MINFER_MMQ_RAW_WIDE,
MINFER_MMQ_RAW_KD, MINFER_MMQ_WGMMA, MINFER_MMQ_WGMMA_Q6K, MINFER_MMQ_STREAMK,
MINFER_MMQ_FUSED_PREPASS, MINFER_MMQ_SB, MINFER_MMQ_Q6K_F16, MINFER_MMQ_SB_GLU, MINFER_F16_GLU,
MINFER_F16_ROPE) or GemmConfig's default. Not a command module (minfer.cli lists those).
"""

from __future__ import annotations

from typing import Mapping

import click


# (dest, env key, help): each a --flag/--no-flag boolean named after dest (mmq_kd: a choice)
FLAGS = (
    ("mmq", "MINFER_MMQ",
     "GEMMs on q4_K/q6_K weights via the int8 MMQ kernels (MINFER_MMQ)."),
    ("mmq_raw", "MINFER_MMQ_RAW",
     "MMQ raw kernels; --no-mmq-raw: the R1 comparison kernel (MINFER_MMQ_RAW)."),
    ("mmq_wide", "MINFER_MMQ_RAW_WIDE",
     "Wide raw MMQ kernel; --no-mmq-wide: narrow (MINFER_MMQ_RAW_WIDE)."),
    ("mmq_kd", "MINFER_MMQ_RAW_KD",
     "Wide-kernel staging depth (MINFER_MMQ_RAW_KD): 4 (default) or 8; q4_K: KD/4 "
     "super-blocks per cp.async stage, q6_K: KD per pass (docs/mmq.md)."),
    ("mmq_wgmma", "MINFER_MMQ_WGMMA",
     "q4_K / q6_K GEMMs of the wide config on the Hopper wgmma kernels when the GPU is sm_90 "
     "(default on); --no-mmq-wgmma: the mma.sync wide kernel (MINFER_MMQ_WGMMA)."),
    ("mmq_wgmma_q6k", "MINFER_MMQ_WGMMA_Q6K",
     "With --mmq-wgmma: q6_K on the wgmma kernel too (default on); --no-mmq-wgmma-q6k keeps "
     "q6_K on the wide kernel (MINFER_MMQ_WGMMA_Q6K)."),
    ("mmq_stream_k", "MINFER_MMQ_STREAMK",
     "wgmma kernels: split the tiles of a ragged last wave by k over all SMs (stream-K, default "
     "on); --no-mmq-stream-k: whole tiles only (MINFER_MMQ_STREAMK)."),
    ("mmq_fused_prepass", "MINFER_MMQ_FUSED_PREPASS",
     "wgmma ffn_down: quantize its input in the swiglu launch (default on); "
     "--no-mmq-fused-prepass: swiglu to f16, then the q8_1 prepass (MINFER_MMQ_FUSED_PREPASS)."),
    ("mmq_sb", "MINFER_MMQ_SB",
     "q4_K / q6_K GEMMs of the wgmma config on the super-block kernels: activations quantized "
     "per 256 values (like llama.cpp's q8_K) instead of 32, so the tensor core sums a whole "
     "super-block (default off; MINFER_MMQ_SB; docs/mmq.md)."),
    ("mmq_q6k_f16", "MINFER_MMQ_Q6K_F16",
     "Keep q6_K GEMMs on the f16 path while q4_K runs MMQ (default off; on sm_90 the q6_K MMQ "
     "kernels are slower than f16 at prefill; MINFER_MMQ_Q6K_F16)."),
    ("mmq_sb_glu", "MINFER_MMQ_SB_GLU",
     "With --mmq-sb: the q4_K gate|up GEMM writes silu(gate) * up as f16 from its epilogue "
     "(default on); --no-mmq-sb-glu: f32 gate|up, then a swiglu launch (MINFER_MMQ_SB_GLU)."),
    ("f16_glu", "MINFER_F16_GLU",
     "f16 path: the gate|up GEMM writes silu(gate) * up as f16 from its epilogue (default on); "
     "--no-f16-glu: f32 gate|up, then a swiglu launch (MINFER_F16_GLU)."),
    ("f16_rope", "MINFER_F16_ROPE",
     "f16 path: the fused q|k|v GEMM writes roped q and the K/V cache rows as f16 from its "
     "epilogue (default on, where its tiles fit one wave: pp512 on an 8B model; llama-order "
     "rope); --no-f16-rope: f32 q|k|v, then a rope launch (MINFER_F16_ROPE)."),
)


def gemm_options(f):
    """Decorator: the GEMM-path flags of FLAGS, each None unless given."""
    for dest, _, help_ in reversed(FLAGS):
        flag = "--" + dest.replace("_", "-")
        if dest == "mmq_kd":
            f = click.option(flag, dest, type=click.Choice(["4", "8"]), default=None,
                             help=help_)(f)
        else:
            f = click.option(f"{flag}/--no-{flag[2:]}", dest, default=None, help=help_)(f)
    return f


def gemm_overrides(**flags) -> dict[str, str]:
    """The flags that were given (FLAGS' dests, None: not given), as GemmConfig.resolve
    overrides (MINFER_* keys)."""
    env = {dest: key for dest, key, _ in FLAGS}
    unknown = set(flags) - set(env)
    if unknown:
        raise TypeError(f"unknown GEMM flag(s): {', '.join(sorted(unknown))}")
    return {env[d]: str(int(v)) if isinstance(v, bool) else str(v)
            for d, v in flags.items() if v is not None}


def gemm_config(env: Mapping[str, str] | None = None, **flags):
    """GemmConfig from the environment, then the given flags (flags win)."""
    from minfer.cuda.config import GemmConfig

    return GemmConfig.resolve(env, gemm_overrides(**flags))
