"""The server's start: the listening socket (bound before the model loads, so a port in use is
said at once), the loaded engine with its scheduler and the app's state (build_state, also the
tests' entry), and uvicorn's run with the drain on SIGTERM / SIGINT. `minfer serve`
(minfer.commands.serve) checks the flags and calls these."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys

from minfer.errors import BadInput


def bind(host: str, port: int) -> socket.socket:
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
    load: dict,
    prefix_cache=True,
    name=None,
    api_key=None,
    max_queue=4096,
    timeout=600.0,
    max_body=8 << 20,
    pooling=None,
    rerank_template=None,
    engine="thread",
    overlap=True,
):
    """The loaded engine, its scheduler and the app's state (also the tests' entry). load:
    engine_load.load_engine's keyword arguments (model_path None: the default model). engine:
    "thread" (the scheduler's thread in this interpreter) or "process" (engine_proc: a spawned
    process loads and runs it; here the GGUF's header and tokenizer only). overlap: the
    scheduler's (minfer.batch.scheduler: forward N+1 launched before N is waited for)."""
    from pathlib import Path

    from minfer.serve.app import State
    from minfer.serve.metrics import Metrics

    model_path = load.get("model_path")
    if model_path is None:
        from minfer.gguf.fetch import default_model_path

        model_path = default_model_path()
    load = {**load, "model_path": str(model_path)}
    metrics = Metrics()
    if engine == "process":
        eng, sched, n_ctx = _start_process(load, prefix_cache, metrics, overlap)
    else:
        from minfer.batch.scheduler import Scheduler
        from minfer.serve.engine_load import load_engine

        eng, n_ctx = load_engine(**load)
        sched = Scheduler(
            eng.backend,
            eng.kv_slots,
            eng.ubatch,
            prefix_cache=prefix_cache,
            metrics=metrics,
            overlap=overlap,
        )
    metrics.kv_slots.set(eng.kv_slots)
    if name is None:
        name = Path(str(model_path)).stem
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


def _start_process(load: dict, prefix_cache: bool, metrics, overlap: bool = True):
    """(EngineShell, EngineProcess, n_ctx): the GGUF's header read here first (a bad file is
    said before any process starts), the child spawned, the tokenizer built while it loads."""
    from minfer.engine.api import context_size
    from minfer.gguf.loader import load_model
    from minfer.host import threads as host_threads
    from minfer.serve.engine_proc import EngineProcess, EngineShell

    model = load_model(load["model_path"])
    c = model.config
    if load["ctx_size"]:
        model.config = c.for_context(context_size(load["ctx_size"], c.n_ctx, 0, 0))
    load["threads"] = host_threads.current()  # -t (its env reaches the child; this, exactly)
    proc = EngineProcess(
        {"engine": load, "prefix_cache": prefix_cache, "overlap": overlap}, metrics
    )
    try:
        eng = EngineShell(model)
        info = proc.wait_ready()
    except BaseException:
        proc.kill()
        raise
    eng.kind, eng.kv_slots, eng.ubatch = info["kind"], info["kv_slots"], info["ubatch"]
    return eng, proc, info["n_ctx"]


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


def run(st, sock: socket.socket, timeout: float, version: str) -> None:
    """Serve st on the listening sock until a signal drains it (timeout: the drain's bound);
    version: the package's, for the OpenAPI document."""
    import uvicorn

    from minfer.serve.app import create_app

    app = create_app(st, version)
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
                from minfer.serve.engine_proc import EngineProcess

                proc = isinstance(st.sched, EngineProcess)
                if proc:  # its pipes served on this loop
                    st.sched.attach(asyncio.get_running_loop())
                mode = "process" if proc else "thread"
                h, p = sock.getsockname()[:2]
                h = f"[{h}]" if ":" in h else h
                print(
                    f"minfer serve: {st.name} on http://{h}:{p} ({st.engine.kind}, context "
                    f"{st.n_ctx}, {st.sched.slots.n * 128} KV slots, engine {mode})",
                    file=sys.stderr,
                    flush=True,
                )

    server = Server(config)

    def engine_died() -> None:  # (engine_proc, on the loop) in-flight requests have their 500
        server.should_exit = True

    st.sched.on_death = engine_died  # (thread mode: an attribute nobody calls)
    # The engine thread drops the GIL at each driver call of a forward (uploads, the graph's
    # launch, the read-back: ~7 a forward) and must win it back from the event loop each time:
    # at CPython's 5 ms switch interval a busy loop held it up to 5 ms a call, ~40 ms a forward
    # of an 8B model on the H100 (the GPU idle half the time under 256 clients). (Process mode:
    # the engine process sets its own; this process then has no other busy thread.)
    from minfer.serve.engine_load import SWITCH_S

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
    from minfer.errors import ResourceError

    dead = getattr(st.sched, "dead", None)
    if dead:
        raise ResourceError(f"{dead}; the server stopped")
    if not server.started:
        raise ResourceError("the server did not start (see the lines above)")
