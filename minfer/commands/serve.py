"""`minfer serve`: the OpenAI-compatible server (docs/serve.md).

Loads the model and builds the backend (kernels compiled, graphs warmed) before the port
opens, then serves on uvicorn until SIGTERM / SIGINT, which drain it: no new requests (503),
those in flight finish within --timeout, exit 0. A second signal stops at once.
"""

from __future__ import annotations

import click

from minfer.commands.gemm_flags import gemm_options
from minfer.errors import BadInput
from minfer.host.threads import threads_option

DEFAULT_PORT = 8080


@click.command("serve")
@click.option(
    "-m",
    "--model",
    "model_path",
    type=click.Path(dir_okay=False),
    help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched once).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface; give --api-key then).",
)
@click.option(
    "--port",
    type=int,
    default=DEFAULT_PORT,
    show_default=True,
    help="TCP port (0: any free port; the line on stderr names it).",
)
@click.option(
    "--api-key",
    default=None,
    envvar="MINFER_API_KEY",
    help="Require `Authorization: Bearer KEY` on every endpoint but /health (or MINFER_API_KEY).",
)
@click.option(
    "--served-model-name",
    "name",
    default=None,
    help="The model's name in requests and /v1/models (default: the file's stem).",
)
@click.option(
    "-c",
    "--ctx-size",
    type=int,
    default=0,
    show_default=True,
    help="Context per request in tokens (0: the model's).",
)
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(["cpu", "cuda"], case_sensitive=False),
    default=None,
    help="cuda or cpu (the numpy reference); default: cuda if a GPU is usable.",
)
@click.option(
    "--dtype",
    type=click.Choice(["f32", "f64"], case_sensitive=False),
    default=None,
    help="CPU reference precision (default f32).",
)
@click.option(
    "--max-batch-tokens",
    "-ub",
    "--ubatch",
    "ubatch",
    type=int,
    default=None,
    help="Tokens in one forward (prompt chunks and decode tokens together; "
    "default 2048 on cuda, 256 on cpu).",
)
@click.option(
    "--kv-slots",
    type=int,
    default=None,
    help="KV cache slots shared by every request and the prefix cache (default: "
    "what GPU memory holds, at least 32768; 8192 on cpu).",
)
@click.option(
    "--max-queue",
    type=int,
    default=4096,
    show_default=True,
    help="Prompts waiting for KV slots at most; past it a request gets 429.",
)
@click.option(
    "--timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds a request may take (then 504), and the drain's bound at shutdown.",
)
@click.option(
    "--max-body",
    type=int,
    default=8 << 20,
    show_default=True,
    help="Request body bytes at most (413 past it).",
)
@click.option(
    "--read-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds a client may take to send a request's head (then the connection "
    "closes) and its body (then 408).",
)
@click.option(
    "--prefix-cache/--no-prefix-cache",
    default=True,
    help="Keep finished prompts' KV rows for later requests that start alike "
    "(least recently used first out).",
)
@click.option(
    "--overlap/--no-overlap",
    default=True,
    help="Launch each forward before the previous one is waited for (the host schedules "
    "while the GPU runs); --no-overlap: one forward at a time (an A/B and a fallback).",
)
@click.option(
    "--pooling",
    type=click.Choice(["last", "mean", "cls"]),
    default=None,
    help="/v1/embeddings' pooling (default: the GGUF's pooling_type, else last).",
)
@click.option(
    "--rerank-template",
    type=click.Path(dir_okay=False),
    default=None,
    help="/v1/rerank's prompt: a text file with {query} and {document} (default: "
    "the GGUF's tokenizer.chat_template.rerank, else Qwen3-Reranker's).",
)
@click.option(
    "--engine",
    "engine_mode",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="Run the engine in a process of its own (the HTTP side never competes with it for "
    "the GIL), or as a thread of this one (one py-spy sees both).",
)
@threads_option
@gemm_options
def serve(
    model_path,
    host,
    port,
    api_key,
    name,
    ctx_size,
    backend_kind,
    dtype,
    ubatch,
    kv_slots,
    max_queue,
    timeout,
    max_body,
    read_timeout,
    prefix_cache,
    overlap,
    pooling,
    rerank_template,
    engine_mode,
    gemm,
) -> None:
    """Serve the model over HTTP in OpenAI's and vLLM's shapes: /v1/completions (echo and
    prompt log-probs, as lm-eval asks), /v1/chat/completions, /tokenize, /detokenize,
    /tokenizer_info, /v1/models, /health, /metrics, /v1/embeddings, /v1/score, /v1/rerank.
    Continuous batching: requests join the
    next forward; a prefix that requests share is computed once."""
    from minfer.host.log import log

    _check(port, ctx_size, ubatch, kv_slots, max_queue, timeout, max_body, read_timeout)
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        from minfer.errors import ResourceError

        raise ResourceError(
            f'minfer serve needs the serve extra ({e.name} is missing): pip install -e ".[serve]"'
        ) from None
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning(
            f"warning: --host {host} without --api-key: anyone who reaches this address can use "
            "the server"
        )
    from minfer import __version__
    from minfer.serve.start import bind, build_state, run

    sock = bind(host, port)  # before the model loads: a port in use is said at once
    template = _read_template(rerank_template) if rerank_template else None
    load = dict(
        model_path=model_path,
        backend_kind=backend_kind,
        dtype=dtype,
        gemm=gemm,
        ctx_size=ctx_size,
        ubatch=ubatch,
        kv_slots=kv_slots,
    )
    st = build_state(
        load,
        prefix_cache,
        name,
        api_key,
        max_queue,
        timeout,
        max_body,
        pooling=pooling,
        rerank_template=template,
        engine=engine_mode,
        overlap=overlap,
    )
    st.read_timeout = read_timeout
    run(st, sock, timeout, __version__)


def _check(
    port, ctx_size, ubatch, kv_slots, max_queue, timeout, max_body, read_timeout=30.0
) -> None:
    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be in [0, 65535], got {port}")
    if ctx_size < 0:
        raise BadInput(f"-c/--ctx-size must be >= 0 (0: the model's context), got {ctx_size}")
    for flag, v, lo in (
        ("--max-batch-tokens", ubatch, 1),
        ("--kv-slots", kv_slots, 1),
        ("--max-queue", max_queue, 1),
        ("--max-body", max_body, 1024),
    ):
        if v is not None and v < lo:
            raise BadInput(f"{flag} must be >= {lo}, got {v}")
    if not timeout > 0:
        raise BadInput(f"--timeout must be > 0 seconds, got {timeout}")
    if not read_timeout > 0:
        raise BadInput(f"--read-timeout must be > 0 seconds, got {read_timeout}")


def _read_template(path: str) -> str:
    from minfer.host.fileio import check_input_file

    check_input_file(path, "--rerank-template")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"--rerank-template {path}: cannot read it as UTF-8 text ({e})") from None
