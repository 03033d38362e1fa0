"""Shared GEMM-path CLI flags (`minfer prefill`, `minfer bench`): they mirror the environment.

    @gemm_options          # adds --mmq/--no-mmq, --mmq-raw/--no-mmq-raw, --mmq-wide/--no-mmq-wide,
    def cmd(..., **gemm): ...   # --mmq-kd 4|8, --mmq-wgmma/--no-.., --mmq-wgmma-q6k/--no-..,
                                # --mmq-stream-k/--no-.., --mmq-fused-prepass/--no-..,
                                # --mmq-sb/--no-mmq-sb, --mmq-q6k-f16/--no-..,
                                # --mmq-sb-glu/--no-mmq-sb-glu
    cfg = gemm_config(**gemm)   # env, then flags (flags win)

An unset flag leaves the environment's value (MINFER_MMQ, MINFER_MMQ_RAW, MINFER_MMQ_RAW_WIDE,
MINFER_MMQ_RAW_KD, MINFER_MMQ_WGMMA, MINFER_MMQ_WGMMA_Q6K, MINFER_MMQ_STREAMK,
MINFER_MMQ_FUSED_PREPASS, MINFER_MMQ_SB, MINFER_MMQ_Q6K_F16, MINFER_MMQ_SB_GLU) or GemmConfig's
default. Not a
command module (minfer.cli lists those).
"""

from __future__ import annotations

from typing import Mapping

import click


def gemm_options(f):
    """Decorator: the eleven GEMM-path flags, each None unless given."""
    opts = [
        click.option("--mmq/--no-mmq", "mmq", default=None,
                     help="GEMMs on q4_K/q6_K weights via the int8 MMQ kernels (MINFER_MMQ)."),
        click.option("--mmq-raw/--no-mmq-raw", "mmq_raw", default=None,
                     help="MMQ raw kernels; --no-mmq-raw: the R1 comparison kernel "
                          "(MINFER_MMQ_RAW)."),
        click.option("--mmq-wide/--no-mmq-wide", "mmq_wide", default=None,
                     help="Wide raw MMQ kernel; --no-mmq-wide: narrow (MINFER_MMQ_RAW_WIDE)."),
        click.option("--mmq-kd", "mmq_kd", type=click.Choice(["4", "8"]), default=None,
                     help="Wide-kernel staging depth (MINFER_MMQ_RAW_KD): 4 (default) or 8; q4_K: KD/4 "
                          "super-blocks per cp.async stage, q6_K: KD per pass (docs/mmq.md)."),
        click.option("--mmq-wgmma/--no-mmq-wgmma", "mmq_wgmma", default=None,
                     help="q4_K / q6_K GEMMs of the wide config on the Hopper wgmma kernels "
                          "when the GPU is sm_90 (default on); --no-mmq-wgmma: the mma.sync "
                          "wide kernel (MINFER_MMQ_WGMMA)."),
        click.option("--mmq-wgmma-q6k/--no-mmq-wgmma-q6k", "mmq_wgmma_q6k", default=None,
                     help="With --mmq-wgmma: q6_K on the wgmma kernel too (default on); "
                          "--no-mmq-wgmma-q6k keeps q6_K on the wide kernel "
                          "(MINFER_MMQ_WGMMA_Q6K)."),
        click.option("--mmq-stream-k/--no-mmq-stream-k", "mmq_stream_k", default=None,
                     help="wgmma kernels: split the tiles of a ragged last wave by k over all "
                          "SMs (stream-K, default on); --no-mmq-stream-k: whole tiles only "
                          "(MINFER_MMQ_STREAMK)."),
        click.option("--mmq-fused-prepass/--no-mmq-fused-prepass", "mmq_fused_prepass",
                     default=None,
                     help="wgmma ffn_down: quantize its input in the swiglu launch (default on); "
                          "--no-mmq-fused-prepass: swiglu to f16, then the q8_1 prepass "
                          "(MINFER_MMQ_FUSED_PREPASS)."),
        click.option("--mmq-sb/--no-mmq-sb", "mmq_sb", default=None,
                     help="q4_K / q6_K GEMMs of the wgmma config on the super-block kernels: "
                          "activations quantized per 256 values (like llama.cpp's q8_K) instead "
                          "of 32, so the tensor core sums a whole super-block (default off; "
                          "MINFER_MMQ_SB; docs/mmq.md)."),
        click.option("--mmq-q6k-f16/--no-mmq-q6k-f16", "mmq_q6k_f16", default=None,
                     help="Keep q6_K GEMMs on the f16 path while q4_K runs MMQ (default off; "
                          "on sm_90 the q6_K MMQ kernels are slower than f16 at prefill; "
                          "MINFER_MMQ_Q6K_F16)."),
        click.option("--mmq-sb-glu/--no-mmq-sb-glu", "mmq_sb_glu", default=None,
                     help="With --mmq-sb: the q4_K gate|up GEMM writes silu(gate) * up as f16 "
                          "from its epilogue (default on); --no-mmq-sb-glu: f32 gate|up, then "
                          "a swiglu launch (MINFER_MMQ_SB_GLU)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def gemm_overrides(mmq=None, mmq_raw=None, mmq_wide=None, mmq_kd=None,
                   mmq_wgmma=None, mmq_wgmma_q6k=None, mmq_stream_k=None,
                   mmq_fused_prepass=None, mmq_sb=None, mmq_q6k_f16=None,
                   mmq_sb_glu=None) -> dict[str, str]:
    """The flags that were given, as GemmConfig.resolve overrides (MINFER_* keys)."""
    out = {}
    for key, v in (("MINFER_MMQ", mmq), ("MINFER_MMQ_RAW", mmq_raw),
                   ("MINFER_MMQ_RAW_WIDE", mmq_wide), ("MINFER_MMQ_RAW_KD", mmq_kd),
                   ("MINFER_MMQ_WGMMA", mmq_wgmma), ("MINFER_MMQ_WGMMA_Q6K", mmq_wgmma_q6k),
                   ("MINFER_MMQ_STREAMK", mmq_stream_k),
                   ("MINFER_MMQ_FUSED_PREPASS", mmq_fused_prepass), ("MINFER_MMQ_SB", mmq_sb),
                   ("MINFER_MMQ_Q6K_F16", mmq_q6k_f16), ("MINFER_MMQ_SB_GLU", mmq_sb_glu)):
        if v is not None:
            out[key] = str(int(v)) if isinstance(v, bool) else str(v)
    return out


def gemm_config(mmq=None, mmq_raw=None, mmq_wide=None, mmq_kd=None, mmq_wgmma=None,
                mmq_wgmma_q6k=None, mmq_stream_k=None, mmq_fused_prepass=None, mmq_sb=None,
                mmq_q6k_f16=None, mmq_sb_glu=None, env: Mapping[str, str] | None = None):
    """GemmConfig from the environment, then the given flags (flags win)."""
    from minfer.cuda.config import GemmConfig

    return GemmConfig.resolve(env, gemm_overrides(mmq, mmq_raw, mmq_wide, mmq_kd, mmq_wgmma,
                                                  mmq_wgmma_q6k, mmq_stream_k,
                                                  mmq_fused_prepass, mmq_sb, mmq_q6k_f16,
                                                  mmq_sb_glu))
