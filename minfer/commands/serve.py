"""`minfer serve`: the OpenAI-compatible server (docs/serve.md).

Loads the model and builds the backend (kernels compiled, graphs warmed) before the port
opens, then serves on uvicorn until SIGTERM / SIGINT, which drain it: no new requests (503),
those in flight finish within --timeout, exit 0. A second signal stops at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

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
    pooling,
    rerank_template,
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
    sock = _bind(host, port)  # before the model loads: a port in use is said at once
    template = _read_template(rerank_template) if rerank_template else None
    st = build_state(
        model_path,
        backend_kind,
        dtype,
        gemm,
        ctx_size,
        ubatch,
        kv_slots,
        prefix_cache,
        name,
        api_key,
        max_queue,
        timeout,
        max_body,
        pooling=pooling,
        rerank_template=template,
    )
    st.read_timeout = read_timeout
    run(st, sock, timeout)


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


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise BadInput(f"--host {host}: not an address this machine can listen on ({e})") from None
    fam, kind, proto, _, addr = infos[0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it an answer's second segment waits ~40 ms for the client's delayed ACK
    sock = socket.socket(fam, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise BadInput(
            f"cannot listen on {host}:{port} ({e.strerror or e}"
            f"{': another process has it' if e.errno == 98 else ''})"
        ) from None
    sock.set_inheritable(True)
    return sock


def build_state(
    model_path,
    backend_kind=None,
    dtype=None,
    gemm=None,
    ctx_size=0,
    ubatch=None,
    kv_slots=None,
    prefix_cache=True,
    name=None,
    api_key=None,
    max_queue=4096,
    timeout=600.0,
    max_body=8 << 20,
    progress=True,
    pooling=None,
    rerank_template=None,
):
    """The loaded engine, its scheduler and the app's state (also the tests' entry)."""
    from pathlib import Path

    from minfer.batch.scheduler import Scheduler
    from minfer.commands.gemm_flags import gemm_choice
    from minfer.engine.api import CPU_SLOTS, CUDA_SLOTS, Engine
    from minfer.serve.app import State
    from minfer.serve.metrics import Metrics

    kind = backend_kind.lower() if backend_kind else None
    eng = Engine(
        model_path,
        backend=kind,
        gemm=gemm_choice(gemm) if kind != "cpu" else "auto",
        ubatch=ubatch,
        progress=progress,
        dtype=dtype.lower() if dtype else None,
    )
    c = eng.model.config
    if ctx_size:
        from minfer.tools.prefill.one import context_size

        eng.model.config = c = c.for_context(context_size(ctx_size, c.n_ctx, 0, 0))
    n_ctx = ctx_size or c.n_ctx
    slots = kv_slots or (CPU_SLOTS if eng.kind == "cpu" else CUDA_SLOTS)
    need = -(-n_ctx // 128) * 128
    eng.prepare(min(need, slots), slots, n_ctx)
    metrics = Metrics()
    metrics.kv_slots.set(eng.kv_slots)
    sched = Scheduler(
        eng.backend, eng.kv_slots, eng.ubatch, prefix_cache=prefix_cache, metrics=metrics
    )
    if name is None:
        from minfer.gguf.fetch import default_model_path

        name = Path(str(model_path or default_model_path())).stem
    st = State(
        eng,
        sched,
        name,
        n_ctx,
        metrics,
        api_key=api_key,
        max_queue=max_queue,
        timeout=timeout,
        max_body=max_body,
    )
    # the pooled endpoints' settings (minfer.serve.pooling.register reads them)
    from minfer.batch.pooling import Reranker, model_pooling

    st.pooling = pooling or model_pooling(eng.model)[0]
    st.reranker = Reranker(eng.model, eng.tok, rerank_template) if rerank_template else None
    return st


class _Drain:
    """SIGTERM / SIGINT: the first drains (no new requests, in-flight ones finish within the
    graceful timeout), a second stops at once. Not re-raised afterwards: a drained server
    exits 0."""

    def __init__(self, server, st):
        self.server, self.st, self.seen = server, st, 0

    def __call__(self, sig, frame) -> None:
        self.seen += 1
        self.st.draining = True
        self.server.should_exit = True
        if self.seen > 1:
            self.server.force_exit = True


SWITCH_S = 0.0005


def run(st, sock: socket.socket, timeout: float) -> None:
    import uvicorn

    from minfer import __version__
    from minfer.serve.app import create_app

    app = create_app(st, __version__)
    from minfer.serve.conn import protocol

    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=int(timeout),
        http=protocol(st.read_timeout),
        h11_max_incomplete_event_size=64 << 10,
        access_log=False,
        timeout_keep_alive=5,
        lifespan="off",
    )

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            handler = _Drain(self, st)
            prev = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in prev.items():
                    signal.signal(s, h)

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                h, p = sock.getsockname()[:2]
                h = f"[{h}]" if ":" in h else h
                print(
                    f"minfer serve: {st.name} on http://{h}:{p} ({st.engine.kind}, context "
                    f"{st.n_ctx}, {st.sched.slots.n * 128} KV slots)",
                    file=sys.stderr,
                    flush=True,
                )

    server = Server(config)
    # The engine thread drops the GIL at each driver call of a forward (uploads, the graph's
    # launch, the read-back: ~7 a forward) and must win it back from the event loop each time:
    # at CPython's 5 ms switch interval a busy loop held it up to 5 ms a call, ~40 ms a forward
    # of an 8B model on the H100 (the GPU idle half the time under 256 clients)
    sys.setswitchinterval(SWITCH_S)
    st.sched.start()
    try:
        server.run(sockets=[sock])
    finally:
        st.draining = True
        st.sched.stop()
        sock.close()
    if os.environ.get("MINFER_SERVE_DEBUG"):
        print(f"steps {st.sched.steps}, tokens {st.sched.step_tokens}", file=sys.stderr)
    if not server.started:
        from minfer.errors import ResourceError

        raise ResourceError("the server did not start (see the lines above)")
