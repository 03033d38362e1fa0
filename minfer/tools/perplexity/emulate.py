"""The int8 GEMM paths' number grids on the CPU: a ReferenceBackend that rounds each linear
weight's operands as the GPU path would, so `minfer perplexity --backend cpu --emulate LABEL`
measures a path's distribution gate (docs/design.md gate 6) without a GPU.

The labels and their grids are the paths' own (GemmPath.emulations, collected in
minfer.cuda.paths.EMULATIONS, each with its help line). Which weights take a grid is the CUDA backend's own plan
(minfer.cuda.plan.routes.plan_routes, pure Python: choose_path per weight and the attn_v-alone
rule) for its path on sm_90 at M = 512, the perplexity window; an `every` emulation puts it on
every GEMM, as the q8_1 path rounds an 8B model (K % 256 == 0 everywhere): the reference of gate
6's top-1 floor on a model whose widths leave the q8_1 path few weights (SmolLM2: ffn_down
only). The LM head stays exact for every grid: the GPU runs it on f16 (the f16 GEMV at M = 1, or
its type or K that the int8 kernels do not take). An emulation may put weight kinds on a grid
of their own (Emulation.kinds: blk-fp8down's FP8 ffn_down, which no kernel runs yet), whatever
the routes say: the emulation's weight set, the GPU plan unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

_H200 = SimpleNamespace(arch="sm_90", smem_optin=None)  # the device; unbounded smem: the grid
# is the same on the narrow kernel the smem guard would fall back to


def emulated_grids(model, label: str) -> dict:
    """weight name -> grid for emulation `label`: its path's grid on the linear weights the GPU
    path runs on its int8 kernel (every GEMM but the LM head for an `every` emulation), then
    the grids of the emulation's own kinds (Emulation.kinds: ffn_down on FP8 for blk-fp8down,
    a grid no kernel runs yet) on every weight of that kind, whatever the routes say."""
    from minfer.cuda.paths import EMULATIONS, TABLE
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.routes import linear_names, plan_routes, weight_kind

    path, emu = EMULATIONS[label]
    head = model.output_name
    if emu.every:
        names = [n for n in linear_names(model) if n != head]
    else:
        routes = plan_routes(model, GemmChoice(path.name), _H200, ubatch=512)
        names = [n for n, (p, _) in routes.items() if TABLE[p].int8 and n != head]
    grids = dict.fromkeys(names, emu.grid)
    for n in linear_names(model):
        if n != head and weight_kind(n) in emu.kinds:
            grids[n] = emu.kinds[weight_kind(n)]
    return _calibrated(model, grids)


def _calibrated(model, grids: dict) -> dict:
    """Each grid that keeps a weight's busiest input channels exact (a `bound` method: blk's
    OutlierGrid) bound to this model's channels, from the calibration text's mean squares
    (minfer.tools.perplexity.calibrate, cached)."""
    from minfer.cuda.paths.blk.outliers import busiest
    from minfer.tools.perplexity.calibrate import channel_stats

    out = dict(grids)
    for g in {id(g): g for g in grids.values() if hasattr(g, "bound")}.values():
        names = [n for n, v in grids.items() if v is g]
        ms = channel_stats(model, names)
        b = g.bound({n: busiest(ms[n], g.n) for n in names})
        out.update(dict.fromkeys(names, b))
    return out


def emulated_weights(model, label: str) -> frozenset[str]:
    """The linear weights (names) emulation `label` rounds: those the GPU path runs on its int8
    kernel (every GEMM but the LM head for an `every` emulation) and those of its own kinds."""
    return frozenset(emulated_grids(model, label))


def emulating_backend(model, label: str, max_tokens: int):
    """A float32 ReferenceBackend whose weights see emulated_grids(model, label); its name is
    'cpu+LABEL'."""
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(
        model, dtype=np.float32, max_tokens=max_tokens, grids=emulated_grids(model, label)
    )
    be.name = f"cpu+{label}"
    return be
