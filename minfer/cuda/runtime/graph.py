"""CUDA graphs through the driver API (ctypes on libcuda): capture a stream, replay it.

The pycuda wheel has no graph API, so this calls cuStreamBeginCapture_v2 / cuStreamEndCapture /
cuGraphInstantiateWithFlags / cuGraphLaunch directly, on the context pycuda made current and on
a pycuda Stream's handle. Why: a prefill forward is ~11 launches per layer, each costing
~15 µs of Python + pycuda on the host; replaying one captured graph costs one launch.

    g = capture(rt, stream, lambda: ...launches on `stream`...)   # nothing runs yet
    g.launch(stream)                                              # runs the captured work

Capture mode is "relaxed" so module loads / attribute calls made during the first capture
(lazily built kernels) are allowed; the captured work must not touch the legacy default stream
or synchronize. Every driver error raises GPUError with the call's name and code.
"""

from __future__ import annotations

import ctypes

from minfer.errors import GPUError

_CAPTURE_RELAXED = 2


def libcuda(purpose: str = "CUDA graphs"):
    """The driver library through ctypes, for the calls pycuda does not wrap (graphs here, TMA
    tensor maps in minfer.cuda.runtime.tma); GPUError naming `purpose` when it cannot be opened."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GPUError(f"{purpose}: cannot open libcuda.so.1 ({e})") from None


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise GPUError(f"CUDA graphs: {what} failed with CUresult {rc}")


class Graph:
    """An instantiated graph (CUgraphExec) and its source graph; freed with `destroy()`."""

    def __init__(self, lib, graph: ctypes.c_void_p, exe: ctypes.c_void_p, nodes: int):
        self._lib, self._graph, self._exe, self.nodes = lib, graph, exe, nodes

    def launch(self, stream) -> None:
        _check(self._lib.cuGraphLaunch(self._exe, ctypes.c_void_p(stream.handle)), "cuGraphLaunch")

    def destroy(self) -> None:
        if self._exe:
            self._lib.cuGraphExecDestroy(self._exe)
            self._lib.cuGraphDestroy(self._graph)
            self._exe = self._graph = None


def capture(stream, body) -> Graph:
    """Record what `body()` launches on `stream` (a pycuda Stream) into an instantiated Graph.
    If body raises, the capture is ended and discarded and the exception propagates."""
    lib = libcuda()
    h = ctypes.c_void_p(stream.handle)
    _check(lib.cuStreamBeginCapture_v2(h, ctypes.c_int(_CAPTURE_RELAXED)), "cuStreamBeginCapture")
    graph = ctypes.c_void_p()
    try:
        body()
    except BaseException:
        lib.cuStreamEndCapture(h, ctypes.byref(graph))
        if graph:
            lib.cuGraphDestroy(graph)
        raise
    _check(lib.cuStreamEndCapture(h, ctypes.byref(graph)), "cuStreamEndCapture")
    n = ctypes.c_size_t(0)
    _check(lib.cuGraphGetNodes(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
    exe = ctypes.c_void_p()
    rc = lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
    if rc != 0:
        lib.cuGraphDestroy(graph)
        _check(rc, "cuGraphInstantiateWithFlags")
    return Graph(lib, graph, exe, int(n.value))
