"""`minfer prefill`: run a prompt through a model, report prefill/decode tok/s and greedy ids.

With no arguments: the default model (SmolLM2-135M-Instruct Q4_1) asked DEFAULT_CHAT_PROMPT
through its own chat template, decoding until its end-of-turn token, on the GPU when one is
usable, else on the CPU reference. With -p/--prompt-file the text goes in as it is (plain
completion, decoding through EOS, as the identity gates need) unless --chat. Options and the
backend are checked before the default model is fetched; the prompt and context before the
weights are loaded. Progress bars go to stderr (and only on a terminal); --json prints exactly
one JSON object on stdout.
"""

from __future__ import annotations

import json
import math
import sys
import time

import click

from minfer.commands.gemm_flags import check_gemm_backend, gemm_choice, gemm_options
from minfer.engine.backends import make_backend
from minfer.errors import BadInput, GPUError
from minfer.host.fileio import check_cap, prompt_cap, read_prompt_file
from minfer.host.threads import threads_option
from minfer.host.words import plural

DEFAULT_PROMPT = "The name of the capital city of France is"  # golden prompt 0 (--no-chat)
DEFAULT_CHAT_PROMPT = "What is the capital of France?"
# default prompt tokens per forward: the GPU runs a prompt up to 4096 tokens as one chunk (what
# bench times); the CPU reference's attention scores grow with the chunk's square
UBATCH = {"cuda": 4096, "cpu": 512}


def pick_backend_kind(requested: str | None) -> tuple[str, str]:
    """(kind, why): the requested backend, else cuda when a GPU is usable, else cpu."""
    if requested:
        return requested.lower(), "requested"
    from minfer.cuda.runtime.runtime import gpu_available

    if gpu_available():
        return "cuda", "auto: GPU found"
    return "cpu", "auto: no usable GPU"


def check_backend(kind: str, dtype: str | None) -> None:
    """Fail fast (before the model loads) when the requested backend cannot run."""
    if kind == "cpu":
        return
    if dtype is not None:
        raise BadInput("--dtype applies to --backend cpu only")
    try:
        import minfer.cuda.backend  # noqa: F401
    except ImportError as e:
        raise GPUError(
            f"the cuda backend cannot be imported ({e}); "
            "use --backend cpu to run on the CPU reference"
        ) from None
    from minfer.cuda.runtime.runtime import gpu_available

    if not gpu_available():
        raise GPUError(
            "no usable CUDA GPU (or pycuda missing); use --backend cpu to run on the CPU reference"
        )


def check_options(prompt, prompt_file, chat, system, n_predict, ubatch, ctx_size) -> None:
    """The checks that need no model: run before the default model is fetched."""
    if prompt is not None and prompt_file is not None:
        raise BadInput("give either -p/--prompt or --prompt-file, not both")
    if system is not None and chat is False:
        raise BadInput("--system goes with --chat, not --no-chat")
    if n_predict < -2:
        raise BadInput(
            f"-n/--n-predict must be >= 0, or -1 (until the end of generation or "
            f"of the context), got {n_predict}"
        )
    if ubatch is not None and ubatch < 1:
        raise BadInput(f"--ubatch must be >= 1, got {ubatch}")
    if ctx_size < 0:
        raise BadInput(f"-c/--ctx-size must be >= 0 (0: the model's context), got {ctx_size}")


def check_batch_options(
    prompts_path,
    prompt,
    prompt_file,
    as_json,
    output,
    logprobs,
    prefix_share,
    top_logprobs: int = 0,
    with_ids: bool = False,
) -> None:
    """--prompts and the options that go with it (or only with it)."""
    from minfer.reference.ops import TOP_MAX

    if not 0 <= top_logprobs <= TOP_MAX:
        raise BadInput(f"--top-logprobs must be in [0, {TOP_MAX}], got {top_logprobs}")
    if prompts_path is None:
        for flag, given in (
            ("-o/--output", output is not None),
            ("--logprobs", logprobs),
            ("--no-prefix-share", not prefix_share),
            ("--top-logprobs", top_logprobs > 0),
            ("--prompt-ids", with_ids),
        ):
            if given:
                raise BadInput(f"{flag} goes with --prompts FILE")
        return
    if prompt is not None or prompt_file is not None:
        raise BadInput("give either --prompts FILE or one prompt (-p / -f), not both")
    if as_json:
        raise BadInput(
            "--json: with --prompts the results are JSON lines already (stdout, or "
            "-o FILE); the summary goes to stderr"
        )


def check_ray_options(prompts_path, address, actors, batch) -> None:
    """--ray and its options: with --prompts only, counts >= 1, the extra installed (exit 3)
    before any model is fetched or loaded."""
    if address is None:
        for flag, given in (("--ray-actors", actors is not None), ("--ray-batch", batch != 256)):
            if given:
                raise BadInput(f"{flag} goes with --ray")
        return
    if prompts_path is None:
        raise BadInput("--ray goes with --prompts FILE")
    if actors is not None and actors < 1:
        raise BadInput(f"--ray-actors must be >= 1, got {actors}")
    if batch < 1:
        raise BadInput(f"--ray-batch must be >= 1, got {batch}")
    if not address.strip():
        raise BadInput("--ray ADDRESS is empty (auto: a local Ray instance)")
    from minfer.engine.ray.predictor import need_ray

    need_ray("--ray")


def file_prompt(path: str) -> str:
    """A -f/--prompt-file prompt as llama.cpp's -f reads it: the file as is, less one
    trailing newline (an editor's or `echo`'s, not part of the prompt)."""
    text = read_prompt_file(path)
    return text[:-1] if text.endswith("\n") else text


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


def context_size(ctx_size: int, model_ctx: int, n_prompt: int, n_predict: int) -> int:
    """The context the run may use: -c/--ctx-size (0: the model's), at most the model's."""
    if ctx_size == 0:
        return model_ctx
    if ctx_size > model_ctx:
        raise BadInput(f"-c/--ctx-size {ctx_size} exceeds the model's context of {model_ctx}")
    if n_prompt + n_predict > ctx_size:
        raise BadInput(
            f"prompt of {plural(n_prompt, 'token')} + {n_predict} generated tokens = "
            f"{n_prompt + n_predict} exceeds -c/--ctx-size {ctx_size}"
        )
    return ctx_size


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else float(x)


@click.command("prefill")
@click.option(
    "-m",
    "--model",
    "model_path",
    type=click.Path(dir_okay=False),
    help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched once).",
)
@click.option(
    "-p",
    "--prompt",
    default=None,
    help=f"Prompt text (default: {DEFAULT_CHAT_PROMPT!r} as a chat, or "
    f"{DEFAULT_PROMPT!r} with --no-chat).",
)
@click.option(
    "-f",
    "--file",
    "--prompt-file",
    "prompt_file",
    type=click.Path(),
    default=None,
    help="Read the prompt (UTF-8) from a file; - reads stdin. One trailing newline "
    "is dropped, as llama.cpp's -f does.",
)
@click.option(
    "--chat/--no-chat",
    default=None,
    help="Wrap the prompt in the model's own chat template (tokenizer.chat_template). "
    "Default: on when no prompt is given and the model has a template.",
)
@click.option(
    "-sys",
    "--system",
    "--system-prompt",
    "system",
    default=None,
    help="System message for --chat (implies --chat).",
)
@click.option(
    "--special/--no-special",
    default=True,
    help="Special-token text in the prompt (<|im_start|>) is the special token, as "
    "in llama.cpp (default); --no-special: plain text.",
)
@click.option(
    "-n",
    "--n-predict",
    "--greedy",
    "n_greedy",
    type=int,
    default=32,
    show_default=True,
    help="Tokens to generate after the prompt (greedy argmax); "
    "-1: until the end of generation (EOS) or of the context "
    "(-c), as llama.cpp (-2 the same).",
)
@click.option(
    "--stop-at-eos/--no-stop-at-eos",
    " /--ignore-eos",
    default=None,
    help="Stop generating at the end-of-generation token (EOS/EOT). Default: on with "
    "--chat, off otherwise (decoding runs through EOS). --ignore-eos "
    "(llama.cpp's) is --no-stop-at-eos.",
)
@click.option(
    "--chat-template",
    "--chat-template-file",
    "chat_template",
    default=None,
    metavar="NAME|FILE",
    help="The chat template for --chat: a built-in (chatml, llama3, gemma, phi3, "
    "mistral) or a jinja file, for a model without one or over its own.",
)
@click.option(
    "-c",
    "--ctx-size",
    type=int,
    default=0,
    show_default=True,
    help="Context size in tokens (0: the model's); prompt + generated must fit.",
)
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(["cpu", "cuda"], case_sensitive=False),
    default=None,
    help="cuda (our kernels) or cpu (the numpy reference: the correctness oracle the GPU "
    "paths are checked against, not built for speed); default: cuda if a GPU is "
    "usable.",
)
@click.option(
    "-ub",
    "--ubatch",
    "--ubatch-size",
    "ubatch",
    type=int,
    default=None,
    help=f"Prompt tokens per forward call (default: {UBATCH['cuda']} on cuda, so a "
    f"prompt up to that long is one chunk as `minfer bench` times it; "
    f"{UBATCH['cpu']} on cpu).",
)
@click.option(
    "--dtype",
    type=click.Choice(["f32", "f64"], case_sensitive=False),
    default=None,
    help="CPU reference precision (default f32).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(),
    default=None,
    help="Many prompts, one a line (- reads stdin), packed into shared forwards: "
    "JSONL results in input order on stdout or -o (docs/batch.md).",
)
@click.option(
    "--prompts-format",
    type=click.Choice(["jsonl", "lines"]),
    default="jsonl",
    show_default=True,
    help='jsonl: a JSON string, {"prompt": ...} or {"messages": [...]} a line; lines: plain text.',
)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(),
    default=None,
    help="With --prompts: write the JSONL results to FILE (atomically) instead of stdout.",
)
@click.option(
    "--logprobs",
    is_flag=True,
    help="With --prompts: each prompt token's log-probability after the first, and "
    "their sum (an eval harness's log-likelihood).",
)
@click.option(
    "--top-logprobs",
    "top_logprobs",
    type=int,
    default=0,
    help="With --prompts: the N (<= 20) most likely tokens (id, text, log-prob) at "
    "each scored token: a continuation's, every prompt token's with --logprobs.",
)
@click.option(
    "--prompt-ids",
    "with_ids",
    is_flag=True,
    help="With --prompts: each record gives its prompt's token ids.",
)
@click.option(
    "--prefix-share/--no-prefix-share",
    default=True,
    help="With --prompts: compute a prefix that prompts share once (default on).",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="auto",
    default=None,
    metavar="[ADDRESS]",
    help="With --prompts: shard the prompts over Ray actors, one a GPU (the ray "
    "extra): auto (alone) starts a local Ray instance, an ADDRESS joins that "
    "cluster; the same records, in input order (docs/batch.md).",
)
@click.option(
    "--ray-actors",
    type=int,
    default=None,
    metavar="N",
    help="With --ray: N actors (default: one a GPU of the cluster; with --backend cpu one a CPU).",
)
@click.option(
    "--ray-batch",
    type=int,
    default=256,
    show_default=True,
    metavar="N",
    help="With --ray: prompts a batch (the unit an actor runs, and runs again if it dies).",
)
@threads_option
@gemm_options
def prefill(
    model_path,
    prompt,
    prompt_file,
    chat,
    system,
    special,
    n_greedy,
    stop_at_eos,
    ctx_size,
    backend_kind,
    ubatch,
    dtype,
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
    ray_batch,
    chat_template,
    gemm,
) -> None:
    """Prefill a prompt, print tok/s (prefill and decode apart) and the generated ids and text.
    With --prompts FILE: every prompt of the file, packed, results as JSONL."""
    from minfer.batch import single
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    check_options(prompt, prompt_file, chat, system, n_greedy, ubatch, ctx_size)
    check_batch_options(
        prompts_path,
        prompt,
        prompt_file,
        as_json,
        output,
        logprobs,
        prefix_share,
        top_logprobs,
        with_ids,
    )
    check_ray_options(prompts_path, ray_address, ray_actors, ray_batch)
    dtype = dtype.lower() if dtype else None
    kind, why = pick_backend_kind(backend_kind)
    ubatch_opt, ubatch = ubatch, UBATCH[kind] if ubatch is None else ubatch
    check_backend(kind, dtype)  # before the default model is fetched
    check_gemm_backend(kind, gemm, why=why)
    choice = gemm_choice(gemm)  # --gemm / the environment, resolved once
    text = file_prompt(prompt_file) if prompt_file is not None else prompt  # capped
    if text is not None and "\0" in text:  # kept, as llama.cpp keeps them, but said
        from minfer.host.log import log

        where = "stdin" if prompt_file == "-" else prompt_file or "-p"
        log.warning(
            f"{where}: the prompt holds {text.count(chr(0))} NUL byte(s), the first at "
            f"character {text.index(chr(0))}; tokenized as text, as llama.cpp does "
            "(a UTF-16 or binary file?)"
        )
    if model_path is None:
        from minfer.gguf.fetch import default_model_path

        model_path = default_model_path()

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
        check_gemm_backend(kind, gemm, why=why)
    if prompts_path is not None:
        from minfer.commands.prefill_batch import run_prompts

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
            ray=None
            if ray_address is None
            else dict(
                address=ray_address, actors=ray_actors, batch=ray_batch, model_path=str(model_path)
            ),
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
