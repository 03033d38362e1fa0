"""The int8 GEMM paths' number grids on the CPU: a ReferenceBackend that rounds each linear
weight's operands as the GPU path would, so `minfer perplexity --backend cpu --emulate GRID`
measures a path's distribution gate (docs/design.md gate 6) without a GPU.

| grid   | GPU path it stands for       | rounded (ReferenceBackend option)                       |
| ------ | ---------------------------- | ------------------------------------------------------- |
| q8_1   | wide-kd4 / wide-kd8 / narrow / r1 | activations per 32 (q8_1_inputs)                   |
| q8_1-all | the same grid on every GEMM | as q8_1, every linear weight but the LM head           |
| blk    | blk                          | weights and activations rotated, int8 per 128 (blk_inputs) |
| blk256 | none (an experiment)         | as blk, 256-point rotations and activation scales        |

Which weights take the grid is the CUDA backend's own plan (minfer.cuda.plan.routes.plan_routes,
pure Python: choose_path per weight and the attn_v-alone rule) for that path on sm_90 at M = 512,
the perplexity window: q8_1 takes only q4_K and q6_K weights with K % 256 == 0,
blk every weight with K % 32 == 0. q8_1-all puts the seeds' q8_1 grid on every GEMM, as the
q8_1 path rounds an 8B model (K % 256 == 0 everywhere): the reference of gate 6's top-1 floor on
a model whose widths leave the q8_1 path few weights (SmolLM2: ffn_down only). The LM head stays exact for every grid: the GPU runs it on
f16 (blk: the f16 GEMV at M = 1; the others: its type or K).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

# grid -> (the TABLE path whose routes decide the weights, the blk block)
GRIDS = {"q8_1": ("wide-kd4", 0), "q8_1-all": ("", 0), "blk": ("blk", 128), "blk256": ("blk", 256)}
_H200 = SimpleNamespace(arch="sm_90", smem_optin=None)  # the device; unbounded smem: the grid
# is the same on the narrow kernel the smem guard would fall back to


def emulated_weights(model, grid: str) -> frozenset[str]:
    """The linear weights (names) the GPU path of `grid` runs on its int8 kernel."""
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.routes import linear_names, plan_routes

    if not GRIDS[grid][0]:  # every GEMM
        return frozenset(n for n in linear_names(model) if n != model.output_name)
    from minfer.cuda.paths import TABLE

    routes = plan_routes(model, GemmChoice(GRIDS[grid][0]), _H200, ubatch=512)
    return frozenset(
        n for n, (path, _) in routes.items() if TABLE[path].int8 and n != model.output_name
    )


def emulating_backend(model, grid: str, max_tokens: int):
    """A float32 ReferenceBackend whose emulated_weights(model, grid) see `grid`; its name is
    'cpu+GRID'."""
    from minfer.reference.forward import ReferenceBackend

    names = emulated_weights(model, grid)
    be = ReferenceBackend(
        model,
        dtype=np.float32,
        max_tokens=max_tokens,
        q8_1_inputs=names if grid.startswith("q8_1") else frozenset(),
        blk_inputs=names if grid.startswith("blk") else frozenset(),
        blk_block=GRIDS[grid][1] or 128,
    )
    be.name = f"cpu+{grid}"
    return be
