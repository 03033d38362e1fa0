"""`minfer embed`'s run (the command, minfer.commands.embed, holds the flags): the model loaded,
the dimensions checked, the prompt file read and every line checked before any work
(minfer.batch.prompts), Engine.embed over all of it (pooled jobs, no LM head), then JSONL
records ({"id", "embedding"}, input order) or one float32 .npy array, written atomically.
"""

from __future__ import annotations

import sys
import time


def run(
    model_path,
    prompts_path,
    prompts_format,
    output,
    pooling,
    dimensions,
    normalize,
    kind,
    ubatch,
    timing,
    choose_gemm,
) -> None:
    """choose_gemm(kind): the Engine's gemm for the backend kind (the command's --gemm)."""
    from minfer.batch.pooling import check_dims
    from minfer.batch.prompts import make_encoder, open_prompts
    from minfer.engine.api import Engine
    from minfer.gguf.loader import load_model
    from minfer.host.log import log

    if model_path is None:
        from minfer.gguf.fetch import default_model_path

        model_path = default_model_path()
    model = load_model(model_path)
    check_dims(dimensions, model.config.d_model)
    eng = Engine(model, backend=kind, gemm=choose_gemm(kind), ubatch=ubatch)
    enc = make_encoder(model.metadata, eng.tok, None, None, True)
    with open_prompts(prompts_path, prompts_format, enc, model.config.vocab_size) as src:
        src.scan(model.config.n_ctx, 0)  # every line checked before any work
        prompts = list(src)
    t0 = time.perf_counter()
    vecs = eng.embed(
        [p.ids for p in prompts], pooling=pooling, normalize=normalize, dimensions=dimensions
    )
    dt = time.perf_counter() - t0
    if output is not None and str(output).endswith(".npy"):
        _write_npy(output, vecs)
    else:
        from minfer.batch.output import ResultWriter

        with ResultWriter(output) as w:
            for p, v in zip(prompts, vecs):
                w.write({"id": p.id, "embedding": [round(float(x), 7) for x in v]})
            w.commit()
    n_tok = sum(len(p.ids) for p in prompts)
    if timing:
        log.info(
            f"embed    {len(prompts):,} prompts, {n_tok:,} tokens in {dt:.2f} s: "
            f"{n_tok / dt:,.1f} tok/s ({eng.backend.name})"
        )
    sys.stderr.flush()


def _write_npy(path: str, vecs) -> None:
    import numpy as np

    from minfer.host.fileio import atomic_output

    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, vecs)
