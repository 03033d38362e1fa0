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

import click

from minfer.batch.run import GROUP
from minfer.commands.gemm_flags import check_gemm_backend, gemm_choice, gemm_options
from minfer.errors import BadInput, GPUError
from minfer.host.fileio import read_prompt_file
from minfer.host.threads import threads_option
from minfer.tools.prefill.one import DEFAULT_CHAT_PROMPT, DEFAULT_PROMPT, UBATCH, run


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
    """--ray and its options, and --group: with --prompts only, counts >= 1, the extra
    installed (exit 3) before any model is fetched or loaded."""
    if batch < 1:
        raise BadInput(f"--group must be >= 1, got {batch}")
    if batch != GROUP and prompts_path is None:
        raise BadInput("--group goes with --prompts FILE")
    if address is None:
        if actors is not None:
            raise BadInput("--ray-actors goes with --ray")
        return
    if prompts_path is None:
        raise BadInput("--ray goes with --prompts FILE")
    if actors is not None and actors < 1:
        raise BadInput(f"--ray-actors must be >= 1, got {actors}")
    if not address.strip():
        raise BadInput("--ray ADDRESS is empty (auto: a local Ray instance)")
    from minfer.engine.ray.predictor import need_ray

    need_ray("--ray")


def file_prompt(path: str) -> str:
    """A -f/--prompt-file prompt as llama.cpp's -f reads it: the file as is, less one
    trailing newline (an editor's or `echo`'s, not part of the prompt)."""
    text = read_prompt_file(path)
    return text[:-1] if text.endswith("\n") else text


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
    "--group",
    "--ray-batch",
    "group",
    type=int,
    default=GROUP,
    show_default=True,
    metavar="N",
    help="With --prompts: the prompts in groups of N consecutive ones, a group's waves its own "
    "(the unit a --ray actor runs, and runs again if it dies): a prompt's record depends on "
    "its group only, so a --ray run equals the single-process file with the same N.",
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
    group,
    chat_template,
    gemm,
) -> None:
    """Prefill a prompt, print tok/s (prefill and decode apart) and the generated ids and text.
    With --prompts FILE: every prompt of the file, packed, results as JSONL."""
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
    check_ray_options(prompts_path, ray_address, ray_actors, group)
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

    run(
        model_path=model_path,
        text=text,
        prompt_file=prompt_file,
        chat=chat,
        system=system,
        special=special,
        n_greedy=n_greedy,
        stop_at_eos=stop_at_eos,
        ctx_size=ctx_size,
        kind=kind,
        why=why,
        ubatch_opt=ubatch_opt,
        ubatch=ubatch,
        dtype=dtype,
        choice=choice,
        check_gemm=lambda kind, why: check_gemm_backend(kind, gemm, why=why),
        as_json=as_json,
        prompts_path=prompts_path,
        prompts_format=prompts_format,
        output=output,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        with_ids=with_ids,
        prefix_share=prefix_share,
        ray_address=ray_address,
        ray_actors=ray_actors,
        group=group,
        chat_template=chat_template,
    )
