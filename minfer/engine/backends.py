"""The one place a backend is built (make_backend: prefill, perplexity, bench, check, Engine); a
prompt runs on it through minfer.batch.single (one) or minfer.batch.run (many)."""

from __future__ import annotations

import numpy as np

from minfer.engine.calib import CTX, WINDOWS
from minfer.errors import BadInput


def make_backend(
    kind: str,
    model,
    choice=None,
    max_tokens: int = 4096,
    ubatch: int | None = None,
    dtype: str | None = None,
    progress: bool = True,
    warmup: bool = False,
    kv_slots: int | None = None,
    graphs: bool | None = None,
):
    """The one place a backend is built (prefill, perplexity, bench, check): 'cpu' (the numpy
    reference; dtype 'f64' for the float64 oracle, weights dequantized now) or 'cuda'
    (CudaBackend on `choice`, a resolved minfer.cuda.plan.config.GemmChoice; None: auto).
    warmup=False: no one-token warm-up (batch.single.run and bench warm up the lengths they run).
    kv_slots: the CUDA KV cache's rows for many sequences (minfer.batch; default max_tokens).
    graphs: CUDA graphs (None: the backend's default; the GPU calibration runs without).
    A choice whose path keeps calibrated channels (blk-split) and holds none is calibrated
    here first, on the GPU (bind_channels, below)."""
    if kind == "cpu":
        from minfer.reference.forward import ReferenceBackend

        be = ReferenceBackend(
            model, dtype=np.float64 if dtype == "f64" else np.float32, max_tokens=max_tokens
        )
        be.preload(progress=progress)
        return be
    if kind != "cuda":
        raise BadInput(f"backend {kind!r}: expected cuda or cpu")
    from minfer.cuda.backend import CudaBackend

    choice = bind_channels(model, choice, progress)
    return CudaBackend(
        model,
        choice,
        max_tokens=max_tokens,
        ubatch=max_tokens if ubatch is None else ubatch,
        progress=progress,
        warmup=warmup,
        kv_slots=kv_slots,
        graphs=graphs,
    )


# -- the GPU calibration of kept channels (blk-split): the text and cache of minfer.engine.calib
def cuda_channel_stats(
    model,
    names,
    on: str,
    windows: int = WINDOWS,
    ctx: int = CTX,
    text_path=None,
    cache: bool = True,
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """name -> f64 [K]: the mean of X_j^2 over the calibration windows' rows, X the f16 input
    of linear weight `name` on a CUDA backend of path `on` (which must leave those weights on
    f16: the probe reads their input itself; minfer.cuda.paths.blk.probe)."""
    import gc

    from minfer.engine.calib import cached_stats

    def measure(names, wins):
        from minfer.cuda.paths.blk.probe import mean_squares, probe
        from minfer.cuda.plan.config import GemmChoice

        T = len(wins[0])
        be = make_backend("cuda", model, GemmChoice(on), T, T, progress=progress, graphs=False)
        shapes = {n: tuple(int(s) for s in model.tensor(n).shape) for n in names}
        probes = probe(be.rt, be.lin, shapes)
        for w in wins:  # (one scored row: every chunk runs all its rows through every layer)
            be.window_logits(w, len(w) - 1)
        out = mean_squares(probes)
        del be, probes  # (its device memory back before the calibrated backend loads)
        gc.collect()
        return out

    where = f"the GPU ({on} backend)"
    return cached_stats(model, names, measure, where, "cuda", windows, ctx, text_path, cache)


def bind_channels(model, choice, progress: bool = False, stats=None):
    """`choice` with GemmChoice.channels filled where its path keeps calibrated channels and
    none were given (its weights of GemmPath.calibrated_kinds, calibrated on the backend of
    path.calibrate_on); else `choice` itself. stats: the calibration (tests pass a fake)."""
    from minfer.cuda.paths import TABLE

    if choice is None or choice.channels is not None or choice.path not in TABLE:
        return choice
    p = TABLE[choice.path]
    from minfer.cuda.plan.routes import linear_names, weight_kind

    kinds = p.calibrated_kinds
    names = [n for n in linear_names(model) if weight_kind(n) in kinds]
    if not names:
        return choice
    ms = (stats or cuda_channel_stats)(model, names, p.calibrate_on, progress=progress)
    from dataclasses import replace

    return replace(choice, channels={n: p.kept_channels(ms[n]) for n in names})
