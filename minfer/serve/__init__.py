"""`minfer serve`: an OpenAI-compatible HTTP server over the packed forward (docs/serve.md).

  slots.py      the KV cache's slot blocks and the prefix cache over them (pure)
  scheduler.py  the engine thread: continuous batching, one packed() call a step
  protocol.py   request bodies (OpenAI's and vLLM's fields) and the response objects
  app.py        the ASGI app (Starlette routes through FastAPI): auth, limits, errors, streams
  metrics.py    the Prometheus collectors
"""
