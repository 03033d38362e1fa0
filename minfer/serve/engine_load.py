"""The engine as the server runs it (load_engine): in thread mode in the server's process
(start.build_state), in process mode in the engine process (engine_proc); and the GIL switch
interval both set (SWITCH_S). A module of its own so that neither imports the other."""

from __future__ import annotations

# The engine thread drops the GIL at each driver call of a forward (~7 a forward) and must win
# it back from the other threads each time: at CPython's 5 ms switch interval a busy event
# loop held it up to 5 ms a call (the H100 idle half the time under 256 clients)
SWITCH_S = 0.0005


def load_engine(
    model_path,
    backend_kind=None,
    dtype=None,
    gemm=None,
    ctx_size=0,
    ubatch=None,
    kv_slots=None,
    progress=True,
    threads=None,
):
    """The Engine loaded and prepared for serving (its backend built, kernels compiled) and the
    context; in thread mode here, in process mode in the engine process (engine_proc)."""
    from minfer.cuda.plan.config import gemm_choice
    from minfer.engine.api import CPU_SLOTS, CUDA_SLOTS, Engine, context_size

    kind = backend_kind.lower() if backend_kind else None
    eng = Engine(
        model_path,
        backend=kind,
        gemm=gemm_choice(gemm) if kind != "cpu" else "auto",
        ubatch=ubatch,
        progress=progress,
        dtype=dtype.lower() if dtype else None,
        threads=threads,
    )
    c = eng.model.config
    if ctx_size:
        eng.model.config = c = c.for_context(context_size(ctx_size, c.n_ctx, 0, 0))
    n_ctx = ctx_size or c.n_ctx
    slots = kv_slots or (CPU_SLOTS if eng.kind == "cpu" else CUDA_SLOTS)
    need = -(-n_ctx // 128) * 128
    eng.prepare(min(need, slots), slots, n_ctx)
    return eng, n_ctx
