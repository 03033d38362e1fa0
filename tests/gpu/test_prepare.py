"""GPU: after CudaBackend's warm-up nothing is compiled or loaded inside the timed prefill.

On a cold kernel cache (a temp MINFER_CACHE), every nvcc run happens in prepare.prebuild (the
counts agree), every module the runtime loads is in load_kernels + needed_kernels (the dry
pass), and single.run's timed prefill and decode load no module and record no new graph."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.plan.config import GemmChoice

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from synth_data import tiny_model

    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("synth"), seed=5, workers=None))


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cubin_cache")


@pytest.mark.parametrize("spec", ["", "mmq", "blk"])
def test_nothing_compiles_or_loads_in_the_timed_run(model, rt, cold_cache, monkeypatch, spec):
    from minfer.batch import single
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.load import prepare
    from minfer.cuda.runtime import build

    monkeypatch.setenv("MINFER_CACHE", str(cold_cache))
    monkeypatch.setattr(rt, "_modules", {})  # this test sees every module load
    monkeypatch.setattr(rt, "_functions", {})
    loaded, compiles = [], []
    real_module, real_compile = rt.module, build.compile_cubin
    monkeypatch.setattr(
        rt,
        "module",
        lambda name, options=(): (
            loaded.append((name, tuple(options))),
            real_module(name, options),
        )[1],
    )

    def compile_cubin(name, arch="sm_90", options=(), **kw):  # counts real nvcc runs
        if not build.cubin_path(name, arch, options).exists():
            compiles.append(name)
        return real_compile(name, arch, options, **kw)

    monkeypatch.setattr(build, "compile_cubin", compile_cubin)

    be = CudaBackend(model, GemmChoice.parse_ab(spec, env={}), max_tokens=80, ubatch=32)
    lengths = [32, 13, 1]
    prep = be.warmup(lengths)
    assert len(compiles) == be.n_compiled  # no lazy nvcc run outside prebuild
    assert prep.capture_s > 0 and be._graphs
    assert set(loaded) <= set(prepare.load_kernels(be.routes)) | set(
        prepare.needed_kernels(be, lengths)
    )
    loaded.clear()
    graphs = len(be._graphs)
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, 45)
    res = single.run(be, prompt, n_greedy=4, ubatch=32)  # chunks 32 + 13, decode at 1
    assert loaded == [] and len(compiles) == be.n_compiled and len(be._graphs) == graphs
    assert res.prefill_s > 0 and np.isfinite(res.last_logits).all()
