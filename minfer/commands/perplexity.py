"""`minfer perplexity`: perplexity of a model over a text, and KL divergence against the logits
of another run (design gate 6; docs/perplexity.md). The windows, the math and minfer's logits
file are minfer.tools.perplexity's, llama.cpp's log-prob file minfer.tools.llamacpp_logits',
the printing minfer.commands.perplexity_report's; this module reads the options and runs the
backend's window_logits per window.

Options are checked before the default model is fetched; a --kld-base file's header before the
model loads (its ctx and chunks are the defaults of a --kld-base run) and against the text's
token ids once they are known, so a base from another text, ctx or vocabulary is refused with
one `error:` line (exit 2) before any forward runs. A llama.cpp base carries its token ids:
they are the windows, and no text is read (as llama-perplexity --kl-divergence).
llama-perplexity's spelling: --kl-divergence-base F writes llama.cpp's file F; with
--kl-divergence it reads F as the base.
--emulate GRID runs the CPU backend on an int8 path's number grids (minfer.reference.emulate).
"""

from __future__ import annotations

import contextlib
import time

import click

from minfer.commands.gemm_flags import check_gemm_backend, gemm_choice, gemm_options
from minfer.commands.perplexity_report import Report
from minfer.errors import BadInput
from minfer.host.threads import threads_option

DEFAULT_CTX = 512
DEFAULT_CHUNKS = 4  # 1,020 scored tokens at ctx 512; a --save-logits file of 192 MiB at vocab 49k


def read_text(path: str) -> str:
    from minfer.host.fileio import read_capped
    from minfer.tools.perplexity import TEXT_CAP

    data = read_capped(path, TEXT_CAP, "text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: invalid UTF-8 at byte offset {e.start}") from None


def check_options(
    ctx: int | None,
    chunks: int | None,
    save: str | None,
    base: str | None,
    emulate: str | None = None,
    backend: str | None = None,
):
    if ctx is not None and ctx < 4:
        raise BadInput(f"--ctx must be >= 4 (half of each window is scored), got {ctx}")
    if chunks is not None and chunks < -1:
        raise BadInput(
            f"--chunks must be >= -1 (-1 or 0: every window of the text, -1 as "
            f"llama-perplexity), got {chunks}"
        )
    if save is not None and base is not None:
        raise BadInput("give either --save-logits or --kld-base, not both")
    if emulate is not None and backend is not None and backend.lower() != "cpu":
        raise BadInput(
            f"--emulate {emulate} runs on the CPU backend (--backend cpu), not {backend}"
        )


@click.command("perplexity")
@click.option(
    "-m",
    "--model",
    "model_path",
    type=click.Path(dir_okay=False),
    help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, as for prefill).",
)
@click.option(
    "-f",
    "--file",
    "text_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="UTF-8 text to score (default: the shipped minfer/data/gnu-gpl.txt, ~11,700 tokens).",
)
@click.option(
    "-c",
    "--ctx",
    "--ctx-size",
    "ctx",
    type=int,
    default=None,
    help=f"Window length in tokens (default {DEFAULT_CTX}, or the --kld-base file's); "
    "positions ctx/2 .. ctx-2 of each window are scored.",
)
@click.option(
    "--chunks",
    type=int,
    default=None,
    help=f"Windows to run (default {DEFAULT_CHUNKS}, or the --kld-base file's; "
    "-1 (llama-perplexity's) or 0: every window of the text).",
)
@click.option(
    "--save-logits",
    "save_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the scored rows' f32 logits to FILE (the base of a --kld-base run).",
)
@click.option(
    "--kld-base",
    "base_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Compare with a base run's file: minfer's --save-logits or llama.cpp's "
    "--kl-divergence-base (told by its magic): KL divergence, same top-1, "
    "max |dlogit|.",
)
@click.option(
    "--kl-divergence-base",
    "--save-all-logits",
    "lc_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="As llama-perplexity: write llama.cpp's log-prob file (which llama.cpp's "
    "--kl-divergence reads); with --kl-divergence, read FILE as the base.",
)
@click.option(
    "--kl-divergence",
    "kl_divergence",
    is_flag=True,
    help="As llama-perplexity: compare with the --kl-divergence-base FILE.",
)
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(["cpu", "cuda"], case_sensitive=False),
    default=None,
    help="cuda or cpu (the numpy reference); default: cuda if a GPU is usable.",
)
@click.option(
    "--emulate",
    type=click.Choice(["q8_1", "q8_1-all", "blk", "blk256"]),
    default=None,
    help="CPU: round the GEMM inputs as that GPU path does (q8_1: the wide/narrow/r1 "
    "kernels, q8_1-all: their grid on every GEMM, blk; blk256: blk with "
    "256-point blocks, an experiment), to measure its distribution gate without "
    "a GPU.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@threads_option
@gemm_options
def perplexity(
    model_path,
    text_path,
    ctx,
    chunks,
    save_path,
    base_path,
    lc_path,
    kl_divergence,
    backend_kind,
    emulate,
    as_json,
    gemm,
) -> None:
    """Perplexity over a text in non-overlapping windows (as llama-perplexity), and the KL
    divergence against a saved run's logits (as its --kl-divergence)."""
    import numpy as np

    from minfer.commands.prefill import UBATCH, check_backend, pick_backend_kind
    from minfer.engine.backends import make_backend
    from minfer.gguf.loader import load_model
    from minfer.host.fileio import check_output_path
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools import llamacpp_logits as LC
    from minfer.tools import perplexity as P

    base_path, lc_save = llamacpp_names(lc_path, kl_divergence, base_path)
    if save_path is not None and lc_save is not None:
        raise BadInput(
            "give either --save-logits (minfer's f32 logits) or --kl-divergence-base "
            "(llama.cpp's log-probs), not both"
        )
    check_options(ctx, chunks, save_path or lc_save, base_path, emulate, backend_kind)
    kind, why = pick_backend_kind(backend_kind or ("cpu" if emulate else None))
    check_backend(kind, None)
    if emulate is None:  # --emulate GRID is the CPU's stand-in for a GPU path
        check_gemm_backend(kind, gemm, why=why)
    choice = gemm_choice(gemm)  # --gemm / the environment, resolved once
    for out_path in (save_path, lc_save):
        if out_path is not None:
            check_output_path(out_path)
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
        from minfer.reference.emulate import emulating_backend

        backend = emulating_backend(model, emulate, ctx)
        backend.preload(progress=True)
        n_emulated = len(backend.q8_1_inputs | backend.blk_inputs)
    else:
        backend = make_backend(kind, model, choice, ctx, min(ctx, UBATCH["cuda"]))
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


def llamacpp_names(lc_path: str | None, kl_divergence: bool, base_path: str | None):
    """(the base to read, the llama.cpp file to write) of llama-perplexity's spelling:
    --kl-divergence-base F alone writes F; with --kl-divergence it reads F (as --kld-base F)."""
    if not kl_divergence:
        return base_path, lc_path
    if lc_path is None and base_path is None:
        raise BadInput(
            "--kl-divergence compares with a base run: give --kl-divergence-base "
            "FILE (or --kld-base FILE)"
        )
    if lc_path is not None and base_path is not None and lc_path != base_path:
        raise BadInput("two bases: --kl-divergence-base and --kld-base name different files")
    return base_path or lc_path, None
