"""`minfer serve`: an OpenAI-compatible HTTP server over the packed forward (docs/serve.md).

(the engine thread it drives is minfer/batch/scheduler.py: continuous batching, one
 packed() call a step, the prefix cache over minfer/batch/slots.py)
protocol.py   request bodies (OpenAI's and vLLM's fields) and the response objects
app.py        the ASGI app (Starlette routes through FastAPI): auth, limits, errors, streams
metrics.py    the Prometheus collectors
start.py      the socket, the state (build_state), uvicorn's run and the drain
engine_proc.py  --engine process: the engine in a spawned process, its proxy in the server
engine_load.py  the engine loaded and prepared for serving (either mode)
"""
