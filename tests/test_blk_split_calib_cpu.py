"""CPU: blk-split's GPU calibration without a GPU. The probing route (minfer.cuda.paths.blk.probe)
on the heap runtime against numpy; the calibration (minfer.engine.backends.cuda_channel_stats)
on a fake backend whose forward feeds each ffn_down's probe the window's rows, its cache round
trip under a key distinct from the CPU calibration's; bind_channels and make_backend putting
busiest(mean square) per ffn_down into the choice, and the choice's channels reaching the
weight upload (tests/test_backend_forward_cpu.py runs that forward)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from minfer.cuda.paths.blk import probe as P
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError


@pytest.fixture
def heap(monkeypatch):
    import moe_heap

    return moe_heap.install(monkeypatch)


class _Inner:
    """A route reading the f16 activation itself (operand None), recording its runs."""

    operand = None
    name = "f16"
    weight = "blk.0.ffn_down.weight"

    def __init__(self):
        self.runs = []

    def run(self, rt, scratch, C, x, w, mode):
        self.runs.append((C, x, w, mode))


def test_probe_route_accumulates_then_runs(heap):
    """acc += the column sums of squares of every input (bit for bit col_sumsq_ref's), rows
    counted, then the inner route runs on the same arguments; the rest is the inner's."""
    from minfer.cuda.paths.blk.outliers import col_sumsq_ref

    rng = np.random.default_rng(1)
    K = 160
    lin = {"d": _Inner()}
    probes = P.probe(heap, lin, {"d": (64, K)})
    r = lin["d"]
    assert r is probes["d"] and r.operand is None and r.name == "f16"
    twin = np.zeros(K, np.float32)
    for M in (5, 33, 1):
        x = rng.standard_normal((M, K)).astype(np.float16) * 3
        xd = da.to_device(heap, x)
        r.run(heap, "s", "C", xd, "w", "acc")
        col_sumsq_ref(x, twin)
        assert r.inner.runs[-1] == ("C", xd, "w", "acc")
    assert r.rows == 39 and np.array_equal(r.acc.get(), twin)
    ms = P.mean_squares(probes)
    assert np.array_equal(ms["d"], twin.astype(np.float64) / 39)


def test_probe_refuses_an_operand_route_and_an_idle_weight(heap):
    from minfer.cuda.paths.blk import BLK
    from minfer.cuda.plan.config import GemmChoice

    blk = BLK.route(12, GemmChoice("blk"), "blk.0.ffn_down.weight")
    with pytest.raises(GPUError) as e:
        P.ProbeRoute(blk, None, "blk.0.ffn_down.weight")
    assert "\n" not in str(e.value) and "f16" in str(e.value)
    probes = P.probe(heap, {"d": _Inner()}, {"d": (8, 16)})
    with pytest.raises(GPUError, match="no input reached d"):
        P.mean_squares(probes)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("calib"), seed=3))


def _downs(model):
    return sorted(n for n in model.tensors if n.startswith("blk.") and ".ffn_down." in n)


def _fake_make_backend(heap, model, calls):
    """make_backend's stand-in: a backend whose lin holds f16 routes for every weight and whose
    window_logits runs each ffn_down's route on rows derived from the window's ids (so the
    statistic depends on the calibration text)."""

    def make(kind, m, choice, max_tokens, ubatch, progress=False, graphs=None):
        assert kind == "cuda" and choice.path == "blk" and graphs is False
        calls.append(max_tokens)
        lin = {n: _Inner() for n in _downs(model)}

        def window_logits(ids, first):
            assert first == len(ids) - 1
            for n in lin:
                K = int(model.tensor(n).shape[1])
                x = np.cos(np.outer(ids.astype(np.float64), np.arange(1, K + 1) * 0.01) * 7)
                lin[n].run(heap, None, None, da.to_device(heap, x.astype(np.float16)), None, "acc")

        return types.SimpleNamespace(rt=heap, lin=lin, window_logits=window_logits)

    return make


def _want(model, names, ctx):
    """The mean squares the fake forward's rows give, in float64 (independent of the kernels)."""
    from minfer.engine.calib import CALIB_TEXT, calib_windows

    wins = calib_windows(model, CALIB_TEXT.read_text(), 2, ctx)
    out = {}
    for n in names:
        K = int(model.tensor(n).shape[1])
        xs = [
            np.cos(np.outer(w.astype(np.float64), np.arange(1, K + 1) * 0.01) * 7)
            .astype(np.float16)
            .astype(np.float64)
            for w in wins
        ]
        out[n] = np.mean(np.concatenate(xs) ** 2, axis=0)
    return out


def test_cuda_calibration_and_its_cache(heap, tiny, tmp_path, monkeypatch):
    from minfer.engine import backends, calib

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(backends, "make_backend", _fake_make_backend(heap, tiny, calls))
    names = _downs(tiny)
    ctx = 64
    got = backends.cuda_channel_stats(tiny, names, "blk", ctx=ctx)
    want = _want(tiny, names, ctx)
    rows = sum(len(w) for w in calib.calib_windows(tiny, calib.CALIB_TEXT.read_text(), 2, ctx))
    for n in names:  # f32 sums of `rows` squares <= 1: within rows roundings of 2^-24
        assert np.all(np.abs(got[n] - want[n]) <= (rows + 2) * 2.0**-24 * want[n] + 1e-12)
    assert len(calls) == 1
    again = backends.cuda_channel_stats(tiny, names, "blk", ctx=ctx)  # from the cache
    assert len(calls) == 1 and all(np.array_equal(again[n], got[n]) for n in names)
    raw = calib.CALIB_TEXT.read_bytes()
    cuda_key = calib.cache_key(tiny, sorted(names), 2, ctx, raw, "cuda")
    assert calib.cache_path(cuda_key).is_file()
    assert calib.cache_key(tiny, sorted(names), 2, ctx, raw) != cuda_key  # the CPU's own


def test_bind_channels_and_make_backend(tiny, monkeypatch):
    """blk-split without channels: calibrated on blk, busiest(mean square) per ffn_down into
    the choice the CUDA backend gets; blk, auto and a choice holding channels untouched."""
    from minfer.cuda import backend as cb
    from minfer.cuda.paths.blk.outliers import busiest
    from minfer.cuda.paths.blk.split_path import split_n
    from minfer.cuda.plan.config import GemmChoice
    from minfer.engine import backends

    names = _downs(tiny)
    rng = np.random.default_rng(2)
    ms = {n: rng.random(int(tiny.tensor(n).shape[1])) for n in names}
    seen = []

    def stats(model, ns, on, progress=False):
        seen.append((sorted(ns), on))
        return ms

    for c in (GemmChoice("blk"), GemmChoice(), GemmChoice("blk-split", channels={})):
        assert backends.bind_channels(tiny, c, stats=stats) is c
    assert not seen
    got = backends.bind_channels(tiny, GemmChoice("blk-split"), stats=stats)
    assert seen == [(names, "blk")] and set(got.channels) == set(names)
    for n in names:
        K = int(tiny.tensor(n).shape[1])
        assert np.array_equal(got.channels[n], busiest(ms[n], split_n(K)))

    monkeypatch.setattr(backends, "cuda_channel_stats", stats)
    built = []
    monkeypatch.setattr(cb, "CudaBackend", lambda model, choice, **kw: built.append(choice))
    backends.make_backend("cuda", tiny, GemmChoice("blk-split"), 64, 64)
    assert built[0].path == "blk-split" and set(built[0].channels) == set(names)
