"""`minfer perplexity`'s run (the command, minfer.commands.perplexity, checks the options first):
the base file's header read (its ctx and chunks are the defaults of a --kld-base run; a
llama.cpp base's token ids are the windows, and no text is read), the model loaded and the text
tokenized, the base checked against the windows, then the backend's window_logits per window,
tallied (perplexity, KLD against the base) and printed as llama-perplexity does (report.py);
--save-logits / --kl-divergence-base files written as the windows run.
"""

from __future__ import annotations

import contextlib
import time

from minfer.errors import BadInput
from minfer.tools.perplexity.report import Report

DEFAULT_CTX = 512
DEFAULT_CHUNKS = 4  # 1,020 scored tokens at ctx 512; a --save-logits file of 192 MiB at vocab 49k


def read_text(path: str) -> str:
    from minfer.host.fileio import read_capped
    from minfer.tools.perplexity.windows import TEXT_CAP

    data = read_capped(path, TEXT_CAP, "text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: invalid UTF-8 at byte offset {e.start}") from None


def run(
    model_path,
    text_path,
    ctx,
    chunks,
    save_path,
    lc_save,
    base_path,
    kind: str,
    why: str,
    choice,
    emulate,
    as_json: bool,
    cuda_ubatch: int,
) -> None:
    """One perplexity run on checked options (kind, why: the backend and why it was picked;
    choice: the resolved GemmChoice; lc_save: llama.cpp's file to write)."""
    import numpy as np  # (here: the command's module imports this one for its defaults)

    from minfer.engine.backends import make_backend
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools.perplexity import llamacpp as LC
    from minfer.tools.perplexity import windows as P

    base_hdr = base = lbase = None
    if base_path is not None and LC.is_llamacpp(base_path):  # llama.cpp's: its tokens too
        lbase = LC.Base(base_path)
        for given, have, opt in ((ctx, lbase.ctx, "-c/--ctx"), (chunks, lbase.chunks, "--chunks")):
            if (
                given is not None and given != have and not (opt == "--chunks" and given in (-1, 0))
            ):  # all
                raise BadInput(
                    f"{base_path}: the base was made with {opt} {have}, not {given}"
                    " (leave it out: the base's is taken)"
                )
        ctx, chunks = lbase.ctx, lbase.chunks
    elif base_path is not None:
        base_hdr, base = P.read_logits(base_path)
        ctx = base_hdr["ctx"] if ctx is None else ctx
        chunks = base_hdr["chunks"] if chunks is None else chunks
    ctx = DEFAULT_CTX if ctx is None else ctx
    chunks = DEFAULT_CHUNKS if chunks is None else max(chunks, 0)  # -1: all, as llama.cpp
    if lbase is None:
        text_name = str(text_path) if text_path is not None else str(P.DEFAULT_TEXT)
        text = read_text(text_name)
    else:
        text_name = f"{base_path} (the base's token ids)"
    if model_path is None:
        from minfer.gguf.fetch import default_model_path

        model_path = default_model_path()

    model = load_model(model_path)
    if ctx > model.config.n_ctx:
        raise BadInput(f"--ctx {ctx} exceeds the model's context of {model.config.n_ctx}")
    model.config = model.config.for_context(ctx)  # phi3: llama-perplexity's -c picks the factors
    tok = Tokenizer.from_metadata(model.metadata)
    if lbase is None:
        ids = np.asarray(tok.encode(text), np.int32)  # BOS first when the model adds it
    else:
        lbase.check(model.config.vocab_size, model.config.n_ctx, model.config.vocab_size)
        ids = np.asarray(lbase.tokens, np.int32)
    n = P.n_windows(len(ids), ctx, chunks, text_name)
    bos = tok.bos_id if tok.add_bos else None
    windows = [P.window(ids, i, ctx, bos) for i in range(n)]
    hdr = P.header(model, ctx, n, windows, "")
    if base_hdr is not None:
        P.check_base(base_path, base_hdr, hdr)
    first, rows = P.first_scored(ctx), P.rows_per_window(ctx)

    t0 = time.perf_counter()
    if emulate is not None:
        from minfer.tools.perplexity.emulate import emulating_backend

        backend = emulating_backend(model, emulate, ctx)
        backend.preload(progress=True)
        n_emulated = len(backend.grids)
    else:
        backend = make_backend(kind, model, choice, ctx, min(ctx, cuda_ubatch))
    hdr["backend"] = backend.name
    load_s = time.perf_counter() - t0
    out = {
        "model": str(model_path),
        "backend": backend.name,
        "backend_choice": why,
        "text": text_name,
        "n_tokens": int(len(ids)),
        "ctx": ctx,
        "chunks": n,
        "rows_per_chunk": rows,
        "saved_logits": save_path or lc_save,
        "saved_format": "llama.cpp" if lc_save else "minfer" if save_path else None,
        "kld_base": base_path,
        "kld_base_format": None if base_path is None else "llama.cpp" if lbase else "minfer",
        "emulate": None if emulate is None else {"grid": emulate, "weights": n_emulated},
    }
    show = Report(out, as_json)
    show.head(model.describe())
    tally = P.Tally()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if save_path is not None:
            append = stack.enter_context(P.write_logits(save_path, hdr))
        elif lc_save is not None:  # the ids as llama.cpp writes them: before the BOS swap
            append = stack.enter_context(
                LC.write(lc_save, ctx, model.config.vocab_size, ids[: n * ctx])
            )
        else:
            append = None
        # the [i] line is the progress on a terminal; the bar only where stdout is not one
        bar = show.bar(n)
        if bar is not None:
            stack.callback(bar.close)
        try:
            for i, w in enumerate(windows):
                logits = backend.window_logits(w, first)[:rows]  # positions first .. ctx-2
                targets = w[first + 1 :]  # the next id of each (never the BOS-replaced first id)
                if append is not None:
                    append(logits)
                base_rows = None if base is None else np.asarray(base[i * rows : (i + 1) * rows])
                if base_rows is not None:  # a NaN there would print as `mean KLD nan`
                    P.check_finite(base_path, base_rows, i)
                tally.add(logits, targets, base_rows, None if lbase is None else lbase.logprobs(i))
                show.window(i, tally.running[-1])
                if bar is not None:
                    bar.update()
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: what was measured, then the exit line
            if tally.running:  # (a --save-logits file is not left half-written)
                show.result(
                    {**tally.summary(), "load_s": load_s, "run_s": time.perf_counter() - t0},
                    interrupted=True,
                )
            raise
    show.result({**tally.summary(), "load_s": load_s, "run_s": time.perf_counter() - t0})
