"""CPU: the kernels a CUDA backend prepares before the timed prefill (minfer.cuda.load.prepare).

- A CudaBackend built on a fake runtime (stand-in device arrays, no GPU): every module the
  weight upload and a forward of each prompt length ask the runtime for is in load_kernels /
  needed_kernels (the dry pass), over several GEMM configs, archs and lengths.
- prebuild really compiles (nvcc, as tests/test_kernel_compile.py) into a temp MINFER_CACHE, in
  parallel, and a second call compiles nothing.
- single.run leaves a backend's warm-up out of the prefill timing (a backend whose first
  forward of a shape is slow), and does not warm up a backend without warmup (the CPU).
"""

from __future__ import annotations

import io
import itertools
import sys
import time
import types

import numpy as np
import pytest
from fake_gpuarray import FakeGPUArray, upload_drv
from synth_data import tiny_model

from minfer.cuda.load import prepare
from minfer.cuda.plan.config import GemmChoice
from minfer.errors import GPUError


class _Ptr(int):
    def free(self):
        pass


class _Arr(FakeGPUArray):
    """FakeGPUArray with what the backend calls on its arrays (uploads, reads, frees)."""

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def set(self, a):
        pass

    def get(self):
        return np.zeros(self.shape, self.dtype)


class _Copy2D:
    def __getattr__(self, k):
        return lambda *a, **kw: None

    def __call__(self, *a, **kw):
        pass


class FakeRuntime:
    """Allocates fake addresses, launches nothing; records every module asked for."""

    smem_optin, name = 232448, "fake"
    cfg = types.SimpleNamespace(debug=False, poison=False, device=0)
    poisoning = False
    stream = None

    def __init__(self, arch="sm_90", sm_count=132):
        self.arch, self.sm_count = arch, sm_count
        self.asked: set = set()
        self._next = itertools.count(1 << 20)
        self.drv = types.SimpleNamespace(
            memcpy_htod=lambda *a: None,
            memset_d8=lambda *a: None,
            Memcpy2D=_Copy2D,
            Error=RuntimeError,
            **upload_drv(),
        )

    def alloc(self, nbytes, what="buffer"):
        p = next(self._next) * 256
        for _ in range(-(-max(int(nbytes), 1) // 256)):
            next(self._next)
        return _Ptr(p)

    def workspace(self, key, nbytes, split=None):
        p = self.alloc(nbytes)
        return p if split is None else (np.uintp(p), np.uintp(p + split))

    def module(self, name, options=()):
        self.asked.add((name, tuple(options)))

    def function(self, name, entry, options=(), dyn_smem=0):
        self.asked.add((name, tuple(options)))
        return types.SimpleNamespace(_minfer_name=entry)

    def launch(self, *a, **kw):
        pass

    def poison(self, *a, **kw):
        pass

    def synchronize(self):
        pass

    def mem_info(self):
        return 1 << 40, 1 << 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("prep"), seed=5))


@pytest.fixture
def fakes(monkeypatch):
    from minfer.cuda.runtime import devarray, tma

    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    monkeypatch.setattr(tma, "_encoder", lambda: lambda *a: 0)  # tensor maps: host bytes
    built = []
    monkeypatch.setattr(
        prepare,
        "prebuild",
        lambda specs, arch, progress=False: (built.extend(specs), prepare.Prep())[1],
    )
    return built


# every path of the table, the tuning variants, and the seeds' config
CONFIGS = [
    "",
    "f16:no-glu:no-rope",
    "mmq",
    "wide-kd8",
    "blk",
    "blk:no-glu",
    "narrow",
    "r1",
    "blk:no-stream-k",
    "MINFER_GEMM=r1",
]


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: s or "default")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_prepared_kernels_cover_what_the_backend_loads(tiny, fakes, spec, arch):
    from minfer.cuda.backend import CudaBackend

    cfg = GemmChoice.parse_ab(spec, env={})
    rt = FakeRuntime(arch)
    be = CudaBackend(tiny, cfg, rt=rt, max_tokens=300, ubatch=128, warmup=False, graphs=False)
    # the weight upload asked for nothing load_kernels (built before it) does not name
    assert rt.asked and rt.asked <= set(fakes) == set(prepare.load_kernels(be.routes))
    for lengths in ([1], [7], [128], [300], [128, 44, 1]):
        rt.asked.clear()
        need = set(prepare.needed_kernels(be, lengths))
        assert not rt.asked  # the dry pass loads nothing
        for n in lengths:
            be.reset()
            be.forward(np.zeros(n, np.int32), 0)
        assert rt.asked == need, (lengths, rt.asked ^ need)
    # a prompt longer than ubatch: its chunks are ubatch-sized, the last one the remainder
    assert prepare.chunk_shapes([300], 128) == [(44, True), (128, False)]


def test_warmup_runs_each_length_and_counts(tiny, fakes, monkeypatch):
    """CudaBackend.warmup: prebuild gets the dry pass's list, one forward per length runs
    (untimed), the cache is left empty, and compile / capture add up on the backend."""
    from minfer.cuda.backend import CudaBackend

    rt = FakeRuntime()
    be = CudaBackend(
        tiny, GemmChoice(), rt=rt, max_tokens=64, ubatch=32, warmup=False, graphs=False
    )
    monkeypatch.setattr(
        prepare, "prebuild", lambda specs, arch, progress=False: prepare.Prep(len(specs), 2.5)
    )
    seen = []
    fwd = be.forward
    monkeypatch.setattr(be, "forward", lambda ids, pos0: (seen.append(len(ids)), fwd(ids, pos0))[1])
    p = be.warmup([32, 5, 1, 500])
    assert seen == [1, 5, 32, 64] and be.n_past == 0  # 500: capped at max_tokens
    n = len(prepare.needed_kernels(be, [32, 5, 1, 64]))
    assert (p.n_compiled, be.n_compiled, be.compile_s) == (n, n, 2.5) and p.capture_s > 0


try:
    from minfer.cuda.runtime.build import nvcc

    nvcc()
    HAVE_NVCC = True
except GPUError:
    HAVE_NVCC = False


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not found (CUDA toolkit needed to compile)")
def test_prebuild_compiles_in_parallel_once(tmp_path, monkeypatch):
    from minfer.cuda.runtime import build

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    specs = [("smoke", ()), ("smoke", ("-DMINFER_PREP_TEST=1",)), ("smoke", ())]
    calls = []
    real = build.compile_cubin
    monkeypatch.setattr(build, "compile_cubin", lambda *a: (calls.append(a), real(*a))[1])
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    first = prepare.prebuild(specs, "sm_80", progress=True, workers=2)
    assert first.n_compiled == 2 and first.compile_s > 0 and len(calls) == 2
    assert "compiling 2 kernels for sm_80 (first run only)" in tty.getvalue()
    assert prepare.missing(specs, "sm_80") == []
    assert len(list((tmp_path / "cubin").glob("smoke-sm_80-*.cubin"))) == 2
    tty.seek(0)
    tty.truncate()
    second = prepare.prebuild(specs, "sm_80", progress=True, workers=2)
    assert (second.n_compiled, second.compile_s, len(calls)) == (0, 0.0, 2)
    assert tty.getvalue() == ""  # a warm cache says nothing


class _Tty(io.StringIO):
    def isatty(self):
        return True


class SlowFirstBackend:
    """A fake backend whose first forward of each length costs 0.3 s (a kernel build)."""

    name = "slow-first"

    def __init__(self, with_warmup: bool):
        self.seen: set[int] = set()
        self.warmed = []
        if with_warmup:
            self.warmup = lambda lengths: (
                self.warmed.append(list(lengths)),
                [self._slow(n) for n in lengths],
            )

    def _slow(self, n):
        if n not in self.seen:
            self.seen.add(n)
            time.sleep(0.3)

    def reset(self):
        pass

    def synchronize(self):
        pass

    def forward(self, ids, pos0):
        self._slow(len(ids))
        return np.arange(16, dtype=np.float32)


def test_engine_times_prefill_after_warmup():
    from minfer.batch import single

    be = SlowFirstBackend(with_warmup=True)
    res = single.run(be, list(range(20)), n_greedy=3, ubatch=8, n_ctx=100)
    assert be.warmed == [[1, 4, 8]]  # the chunk lengths 8, 8, 4 and decode's 1
    assert res.warmup_s >= 0.9 and res.prefill_s < 0.2 and res.decode_s < 0.2
    cold = single.run(
        SlowFirstBackend(with_warmup=True),
        list(range(20)),
        n_greedy=3,
        ubatch=8,
        n_ctx=100,
        warmup=False,
    )
    assert cold.prefill_s >= 0.6 and cold.warmup_s == 0.0
    cpu = SlowFirstBackend(with_warmup=False)  # no warmup method: timed as before
    res = single.run(cpu, list(range(20)), n_greedy=1, ubatch=8, n_ctx=100)
    assert res.warmup_s == 0.0 and res.prefill_s >= 0.6


def test_prefill_reports_compile_and_capture_apart(tiny_path, monkeypatch, capsys):
    """`minfer prefill`: a backend's kernel builds and graph capture (its warm-up) show as
    compile / capture on the load line and in --json, not in load_s or the prefill time."""
    import json
    import re

    from minfer.cli import main
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.prefill import one as cmd

    class Warmed(ReferenceBackend):
        n_compiled, compile_s, capture_s = 0, 0.0, 0.0

        def warmup(self, lengths):
            self.lengths = list(lengths)
            time.sleep(0.4)
            self.n_compiled, self.compile_s, self.capture_s = 3, 0.3, 0.1

    made = []
    monkeypatch.setattr(
        cmd,
        "make_backend",
        lambda kind, model, *a: made.append(Warmed(model, max_tokens=64)) or made[-1],
    )
    args = [
        "prefill",
        "-m",
        str(tiny_path),
        "--backend",
        "cpu",
        "-p",
        "abcdefghij",
        "--greedy",
        "2",
        "--ubatch",
        "4",
    ]
    with pytest.raises(SystemExit) as e:
        main(args + ["--json"])
    assert e.value.code == 0
    d = json.loads(capsys.readouterr().out)
    n = d["n_prompt"]
    assert n > 4 and made[0].lengths == sorted({min(4, n - s) for s in range(0, n, 4)} | {1})
    assert (d["n_compiled"], d["compile_s"], d["capture_s"]) == (3, 0.3, 0.1)
    parts = (d["load_read_s"], d["load_tokenizer_s"], d["load_weights_s"])  # load, split
    assert min(parts) >= 0 and sum(parts) == pytest.approx(d["load_s"], abs=1e-6)
    assert d["prefill_s"] < 0.4  # the warm-up's sleep is not in the prefill
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr().out
    assert re.search(
        r"^load +\d+\.\d\d s \(read \d+\.\d\d · tokenizer \d+\.\d\d · weights "
        r"\d+\.\d\d\) · compile 0\.30 s \(3 kernels\) · capture 0\.10 s$",
        out,
        re.M,
    ), out


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("prep_cli"), seed=6)
