"""CPU: the parity cases cover the forward. On the fake runtime of test_backend_forward_cpu (every
launch recorded, launchers' shape checks real, no kernel runs): every form in which the
forward runs a path (plain, accumulating, M = 1, fused groups, the glu and rope epilogues, the
operand from the rmsnorm and from attention's epilogue) is a parity case the path declares
(GemmPath.parity_cases); `minfer check` builds a case of every kind a path declares from the
engine's plan of a model, and each runs through the path's upload and route without error
(the numbers are tests/gpu's and the device's `minfer check`'s business)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from synth_data import tiny_model
from test_backend_forward_cpu import FakeRT, _Arr, fake_tensor_maps

from minfer.cuda.paths import TABLE


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """tiny (llama, head_dim 64: the rope epilogue) and tiny-qwen3 (head_dim 128: attention's
    operand epilogue)."""
    from minfer.gguf.loader import load_model
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    d = tmp_path_factory.mktemp("parity")
    q3 = d / "q3.gguf"
    make_synthetic_model(q3, SynthOptions(preset="tiny-qwen3", seed=2, vocab=512, workers=1))
    return {
        "tiny": load_model(tiny_model(d, seed=3, workers=None)),
        "tiny-qwen3": load_model(str(q3)),
    }


@pytest.fixture
def fake(monkeypatch):
    from fake_gpuarray import install

    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)


def _forward_forms(monkeypatch, model, path: str, arch: str) -> dict[str, set[str]]:
    """path name -> the forms the forward ran on it (parity kinds), over a prefill of two
    chunks and a decode step."""
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.forward import Forward
    from minfer.cuda.paths.base import LinearRoute
    from minfer.cuda.plan.config import GemmChoice

    forms: dict[str, set[str]] = {}
    linear = Forward._linear

    def rec(self, C, A, name, mode, label, q8=None, member=None):
        kind = {"glu": "glu", "acc": "acc"}.get(mode, "gemv" if A.shape[0] == 1 else "f32")
        got = forms.setdefault(self.lin[member or name].path.name, set())
        got.add(kind)
        if member and member != name and mode != "glu":
            got.add("fused")
        return linear(self, C, A, name, mode, label, q8, member)

    monkeypatch.setattr(Forward, "_linear", rec)
    for cls in LinearRoute.__subclasses__():
        if "run_rope" in vars(cls):
            run_rope = cls.run_rope

            def rope(self, *a, _f=run_rope, **kw):
                forms.setdefault(self.path.name, set()).add("rope")
                return _f(self, *a, **kw)

            monkeypatch.setattr(cls, "run_rope", rope)
    rt = FakeRT(arch)
    be = CudaBackend(
        model, GemmChoice(path), rt=rt, max_tokens=300, ubatch=160, warmup=False, graphs=False
    )
    ops = {r.operand: r.path.name for r in be.lin.values() if r.operand is not None}
    saved = []
    for op, p in ops.items():  # the operand producers the forward calls (frozen: set directly)
        for field, kind in (("norm", "norm"), ("attn", "attn")):
            f = getattr(op, field)
            if f is None:
                continue

            def wrap(*a, _f=f, _k=kind, _p=p, **kw):
                out = _f(*a, **kw)
                if out is not None:
                    forms.setdefault(_p, set()).add(_k)
                return out

            saved.append((op, field, f))
            object.__setattr__(op, field, wrap)
    try:
        n = 200
        be.forward_device(np.arange(n, dtype=np.int32) % 50, 0)
        be.forward_device(np.array([3], np.int32), n)
    finally:
        for op, field, f in saved:
            object.__setattr__(op, field, f)
    return forms


@pytest.mark.parametrize(
    "model,path,arch",
    [
        ("tiny", "f16", "sm_90"),
        ("tiny", "blk", "sm_90"),
        ("tiny-qwen3", "blk", "sm_90"),
        ("tiny", "wide-kd4", "sm_80"),
        ("tiny", "r1", "sm_80"),
    ],
)
def test_every_form_the_forward_runs_is_a_parity_case(monkeypatch, fake, models, model, path, arch):
    forms = _forward_forms(monkeypatch, models[model], path, arch)
    assert forms.get(path), forms
    for p, kinds in forms.items():
        assert kinds <= set(TABLE[p].parity_cases), (p, kinds - set(TABLE[p].parity_cases))
    # the epilogues this model and path have are really exercised (the test would be vacuous
    # otherwise)
    want = {"f16": {"glu", "rope", "fused"}, "blk": {"glu", "norm"}}.get(path, {"fused"})
    if model == "tiny-qwen3" and path == "blk":
        want = want | {"attn"}
    assert want <= forms[path], (want, forms[path])


@pytest.mark.parametrize(
    "model,path,arch",
    [("tiny", "f16", "sm_90"), ("tiny-qwen3", "blk", "sm_90"), ("tiny", "wide-kd4", "sm_80")],
)
def test_check_builds_and_runs_every_declared_case(fake, models, model, path, arch):
    from minfer.cuda.paths import parity
    from minfer.tools.check import parity_cases

    m, p = models[model], TABLE[path]
    rt = FakeRT(arch)
    cases = parity_cases(rt, m, p)
    kinds = {c.kind for c, _ in cases}
    assert kinds == set(p.parity_cases), (kinds, p.parity_cases)
    rng = np.random.default_rng(0)
    for case, label in cases:
        rt.launches.clear()
        err = parity.run(rt, case, m.config, rng, 16)
        assert rt.launches, case.kind  # the GPU side launched something
        assert not np.isnan(err) or case.kind in ("norm", "attn"), case.kind
        assert label.startswith(path) and case.shape() and case.name.endswith(".weight")
        if case.kind in ("fused", "glu", "rope"):
            assert "|" in case.name
