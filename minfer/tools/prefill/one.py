"""`minfer prefill`'s run, once its options are checked (minfer.commands.prefill): the model
loaded (the header and the tensors' map) and its chat template set, the CPU chosen where an
automatic choice found a GPU the model cannot run on; with --prompts the file through
many.run_prompts, else one prompt tokenized (the default one in the mode), its context checked,
the backend built and the prompt run (minfer.batch.single: timed prefill, greedy decode), then
the report: the lines, or one JSON object (--json).
"""

from __future__ import annotations

import json
import math
import sys
import time

import click

from minfer.engine.api import context_size
from minfer.engine.backends import make_backend
from minfer.host.fileio import check_cap, prompt_cap
from minfer.host.words import plural

DEFAULT_PROMPT = "The name of the capital city of France is"  # golden prompt 0 (--no-chat)
DEFAULT_CHAT_PROMPT = "What is the capital of France?"
# default prompt tokens per forward: the GPU runs a prompt up to 4096 tokens as one chunk (what
# bench times); the CPU reference's attention scores grow with the chunk's square
UBATCH = {"cuda": 4096, "cpu": 512}


def prompt_ids(
    meta, tok, text: str | None, chat: bool | None, system: str | None, special: bool
) -> tuple[bool, list[int]]:
    """(chat used, token ids). chat None: a chat when no prompt was given and the model has a
    template (or --system was given); the default prompt goes with the mode."""
    from minfer.text import chat as chat_mod

    if chat is None:
        chat = system is not None or (text is None and chat_mod.has_template(meta))
    if text is None:
        text = DEFAULT_CHAT_PROMPT if chat else DEFAULT_PROMPT
    if chat:
        return True, chat_mod.encode(meta, tok, text, system, parse_special=special)
    return False, tok.encode(text, parse_special=special)


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else float(x)


def run(
    *,
    model_path,
    text,
    prompt_file,
    chat,
    system,
    special,
    n_greedy,
    stop_at_eos,
    ctx_size,
    kind,
    why,
    ubatch_opt,
    ubatch,
    dtype,
    choice,
    check_gemm,
    as_json,
    prompts_path,
    prompts_format,
    output,
    logprobs,
    top_logprobs,
    with_ids,
    prefix_share,
    ray_address,
    ray_actors,
    group,
    chat_template,
) -> None:
    """One `minfer prefill` on checked options (kind, why: the backend and why; ubatch_opt: the
    -ub given, ubatch: the one used; choice: the resolved GemmChoice; text: the prompt read,
    None for the default one; check_gemm(kind, why): the command's check of --gemm against a
    backend, again when the CPU is chosen here)."""
    from minfer.batch import single
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    if chat_template is not None:  # a bad name or file refused before the model loads
        from minfer.text.chat import load_template

        load_template(chat_template)
    t0 = time.perf_counter()
    model = load_model(model_path)
    read_s = time.perf_counter() - t0  # the header, metadata and the map of the tensors
    from minfer.text.chat import use_template

    use_template(model.metadata, chat_template)  # over the file's own, if it has one
    from minfer.gguf.arch_keys import gpu_unsupported

    if kind == "cuda" and why.startswith("auto") and gpu_unsupported(model.config):
        kind, why = "cpu", f"auto: {gpu_unsupported(model.config).split(' (')[0]}"
        ubatch = UBATCH[kind] if ubatch_opt is None else ubatch_opt
        check_gemm(kind, why)
    if prompts_path is not None:
        from minfer.tools.prefill.many import run_prompts

        n_ctx = context_size(ctx_size, model.config.n_ctx, 0, 0)
        model.config = model.config.for_context(n_ctx)  # phi3: long or short RoPE factors
        return run_prompts(
            path=prompts_path,
            fmt=prompts_format,
            out=output,
            model=model,
            kind=kind,
            why=why,
            choice=choice if kind == "cuda" else None,
            chat=chat,
            system=system,
            special=special,
            n_predict=n_greedy,
            stop_at_eos=stop_at_eos,
            n_ctx=n_ctx,
            ubatch=ubatch_opt,
            logprobs=logprobs,
            share=prefix_share,
            dtype=dtype,
            top=min(top_logprobs, model.config.vocab_size),
            prompt_ids=with_ids,
            group=group,
            ray=None
            if ray_address is None
            else dict(address=ray_address, actors=ray_actors, model_path=str(model_path)),
        )
    if prompt_file is not None:  # read under a fixed cap before the model; now the context's
        check_cap(
            "stdin" if prompt_file == "-" else prompt_file,
            len(text.encode("utf-8")),
            prompt_cap(model.config.n_ctx),
        )
    t1 = time.perf_counter()
    tok = Tokenizer.from_metadata(model.metadata)
    tok_s = time.perf_counter() - t1  # a 262k SentencePiece vocab: its merges cached
    chat, ids = prompt_ids(model.metadata, tok, text, chat, system, special)
    until_end = n_greedy < 0  # -n -1: until EOS or the end of the context, as llama.cpp
    n_ctx = context_size(ctx_size, model.config.n_ctx, len(ids), 0 if until_end else n_greedy)
    model.config = model.config.for_context(n_ctx)  # phi3: long or short RoPE factors, as -c
    if until_end:
        n_greedy = max(n_ctx - len(ids), 0)
        stop_at_eos = True if stop_at_eos is None else stop_at_eos
    single.validate(len(ids), n_greedy, ubatch, n_ctx)  # before loading weights
    stop_ids = tok.eog_ids if (chat if stop_at_eos is None else stop_at_eos) else ()
    # no one-token warm-up: single.run warms up the run's chunk lengths and decode's at once
    backend = make_backend(kind, model, choice, len(ids) + n_greedy, ubatch, dtype)
    load_s = time.perf_counter() - t0

    res = single.run(
        backend,
        ids,
        n_greedy=n_greedy,
        ubatch=ubatch,
        progress=True,
        n_ctx=n_ctx,
        stop_ids=stop_ids,
    )
    stopped = bool(res.greedy_ids) and res.greedy_ids[-1] in stop_ids
    greedy_text = tok.decode(res.greedy_ids)
    # kernel builds and graph recording (construction and engine warm-up) are reported apart
    compile_s, capture_s = getattr(backend, "compile_s", 0.0), getattr(backend, "capture_s", 0.0)
    n_compiled = getattr(backend, "n_compiled", 0)
    load_s = max(0.0, load_s + res.warmup_s - compile_s - capture_s)
    # the rest of load: the prompt's checks, then weights dequantized (cpu) or uploaded (cuda)
    weights_s = max(0.0, load_s - read_s - tok_s)
    mem = getattr(backend, "memory", None)  # the CUDA backend's memory plan
    # the weights' file bytes into ready weights on the GPU, and how long that took
    up_bytes, up_s = getattr(backend, "upload_bytes", None), getattr(backend, "upload_s", 0.0)
    out = {
        "model": str(model_path),
        "backend": backend.name,
        "backend_choice": why,
        "gemm_routes": getattr(backend, "route_summary", lambda: None)(),
        "memory": mem.as_json() if mem is not None else None,
        "chat": chat,
        "n_prompt": len(res.prompt_ids),
        "prompt_ids": res.prompt_ids,
        "greedy_ids": res.greedy_ids,
        "greedy_text": greedy_text,
        "stopped_at_eos": stopped,
        "load_s": load_s,
        "load_read_s": read_s,
        "load_tokenizer_s": tok_s,
        "load_weights_s": weights_s,
        "upload_bytes": up_bytes,
        "upload_gb_s": _num(up_bytes / up_s / 1e9) if up_s else None,
        "compile_s": compile_s,
        "n_compiled": n_compiled,
        "capture_s": capture_s,
        "prefill_s": res.prefill_s,
        "decode_s": res.decode_s,
        "prefill_tok_s": _num(res.prefill_tok_s),
        "decode_tok_s": _num(res.decode_tok_s),
    }
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"model    {model.describe()}")
    click.echo(f"backend  {backend.name} ({why})")
    if hasattr(backend, "route_summary"):
        click.echo(f"gemm     {backend.route_summary()}")
    if mem is not None:
        click.echo(f"memory   {mem.line()}")
    click.echo(f"prompt   {plural(len(ids), 'token')}" + (" (chat template)" if chat else ""))
    weights = f"weights {weights_s:.2f}"
    if up_bytes and up_s:
        weights += f": {up_bytes / 1e9:.1f} GB at {up_bytes / up_s / 1e9:.1f} GB/s"
    prep = [f"{load_s:.2f} s (read {read_s:.2f} · tokenizer {tok_s:.2f} · {weights})"]
    if n_compiled:
        prep.append(f"compile {compile_s:.2f} s ({plural(n_compiled, 'kernel')})")
    if hasattr(backend, "capture_s"):
        prep.append(f"capture {capture_s:.2f} s")
    click.echo(f"load     {' · '.join(prep)}")
    click.echo(f"prefill  {res.prefill_tok_s:,.1f} tok/s ({res.prefill_s * 1e3:.1f} ms)")
    if len(res.greedy_ids) > 1:
        click.echo(
            f"decode   {res.decode_tok_s:,.1f} tok/s ("
            f"{plural(len(res.greedy_ids) - 1, 'single-token step')}, "
            f"{res.decode_s * 1e3:.1f} ms)"
        )
    click.echo(
        f"greedy   {res.greedy_ids}" + (" (stopped at end of generation)" if stopped else "")
    )
    click.echo(f"text     {greedy_text!r}")
    sys.stdout.flush()
