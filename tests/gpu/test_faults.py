"""GPU faults on the real device (issue 6): out of memory, a launch the driver rejects, poison.

- OOM predicted: CudaBackend on a tiny model whose context (2^30 tokens) gives a 1 TiB KV cache
  raises GPUError naming asked / free before its first allocation (free memory unchanged);
  weights that do not fit (free memory faked small) likewise; an allocation the device cannot
  satisfy (more than its total) says what was asked and what is free.
- Launch failure: block (2048, 1, 1) (over the 1024-thread limit) and dynamic shared memory over
  the cap raise GPUError naming the kernel and its geometry; the context stays usable.
- Poison (RuntimeConfig.poison, on in `minfer check`): with it on, results are bit-identical
  (every poisoned buffer is overwritten before it is read), with graphs and eager, f16 and MMQ;
  when launches are skipped (rt.launch patched to a no-op) the outputs read NaN, not the stale
  plausible numbers they hold without poison, and CudaBackend.forward raises "non-finite
  logits"; `minfer check` turns that into FAIL rows, exit 1.
All on a tiny synthetic model; well under 30 s.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from minfer.errors import GPUError

pytestmark = pytest.mark.gpu


def _synth(tmp_path_factory, name: str, n_ctx: int = 8192):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp(name), seed=6, n_ctx=n_ctx, workers=None)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return _synth(tmp_path_factory, "tiny-faults")


@pytest.fixture(scope="module")
def tiny(tiny_path):
    from minfer.gguf.loader import load_model

    return load_model(tiny_path)


@pytest.fixture(scope="module")
def huge_ctx(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(_synth(tmp_path_factory, "tiny-ctx1g", n_ctx=1 << 30))


class _Allocs:
    """Wraps rt.alloc to record every allocation's size."""

    def __init__(self, rt):
        self.real, self.sizes = rt.alloc, []

    def __call__(self, nbytes, what="buffer"):
        self.sizes.append(int(nbytes))
        return self.real(nbytes, what)


def _asked_free_gb(msg: str) -> tuple[float, float]:
    """(asked, free) in GB (1e9) from a memory message ('needs 12.5 GB ... 3.4 GB free of')."""
    m = re.search(r"needs ([\d.]+) GB of GPU memory .* ([\d.]+) GB free of", msg)
    assert m, msg
    return float(m.group(1)), float(m.group(2))


# -- out of memory ------------------------------------------------------------------------------
@pytest.mark.parametrize("gemm", ["f16", "wide-kd4", "auto"])
def test_kv_cache_oom_before_any_allocation(rt, huge_ctx, monkeypatch, gemm):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    allocs = _Allocs(rt)
    monkeypatch.setattr(rt, "alloc", allocs)
    rt.synchronize()
    free0, total = rt.mem_info()
    with pytest.raises(GPUError) as e:
        CudaBackend(huge_ctx, GemmChoice(gemm), rt=rt, max_tokens=1 << 30, ubatch=512)
    msg = str(e.value)
    assert allocs.sizes == [], f"allocated {allocs.sizes} before the memory check"
    free1, _ = rt.mem_info()
    assert abs(free1 - free0) < 64 << 20  # nothing large was taken (or leaked)
    asked, free = _asked_free_gb(msg)
    assert asked > 1000 and "KV cache 1099.5 GB" in msg, msg  # 2 layers x 2^30 x 2 x 64 x 2 B x 2
    assert abs(free - free0 / 1e9) < 1.0 and asked > free, (msg, free0)
    assert "\n" not in msg


def test_weights_oom_when_little_memory_is_free(rt, tiny, monkeypatch):
    from minfer.cuda.backend import CudaBackend

    allocs = _Allocs(rt)
    monkeypatch.setattr(rt, "alloc", allocs)
    total = rt.mem_info()[1]
    monkeypatch.setattr(rt, "mem_info", lambda: (1 << 20, total))  # 1 MiB free
    with pytest.raises(
        GPUError,
        match=r"needs [\d.]+ GB of GPU memory \(f16 weights [\d.]+ GB, "
        r".*\) plus the 0\.25 GB margin, 0\.00105 GB free of",
    ):
        CudaBackend(tiny, rt=rt, max_tokens=64, ubatch=16)
    assert allocs.sizes == []


def test_allocation_larger_than_the_device(rt):
    free, total = rt.mem_info()
    ask = total + (1 << 30)
    with pytest.raises(GPUError) as e:
        rt.alloc(ask, "test buffer")
    msg = str(e.value)
    assert "test buffer" in msg and f"asked {ask / 2**20:.1f} MiB" in msg, msg
    assert "free" in msg
    rt.synchronize()  # the failed allocation left the context usable
    assert rt.alloc(1 << 20, "small") is not None


# -- launch failures ----------------------------------------------------------------------------
def _axpy(rt, n=256):
    from minfer.cuda.runtime import devarray as da

    fn = rt.function("smoke", "axpy_f32")
    y = da.to_device(rt, np.zeros(n, np.float32), "y")
    x = da.to_device(rt, np.ones(n, np.float32), "x")
    return fn, y, (da.arg(y), da.arg(x), np.float32(2.0), np.int32(n))


def test_bad_launch_names_kernel_and_geometry(rt):
    fn, y, args = _axpy(rt)
    with pytest.raises(GPUError) as e:
        rt.launch(fn, (1,), (2048, 1, 1), args)  # 2048 threads > the 1024 limit
    msg = str(e.value)
    assert "axpy_f32" in msg and "grid (1, 1, 1)" in msg and "block (2048, 1, 1)" in msg, msg
    with pytest.raises(
        GPUError,
        match=r"axpy_f32 failed \(grid \(1, 1, 1\), block "
        r"\(256, 1, 1\), smem \d+ B\)",
    ):
        rt.launch(fn, (1,), (256,), args, smem=rt.smem_optin + 4096)  # over the smem cap
    # the context is still fine: the same kernel with a valid geometry runs
    rt.launch(fn, (1,), (256,), args)
    rt.synchronize()
    assert np.array_equal(y.get(), np.full(256, 2.0, np.float32))


# -- poison ---------------------------------------------------------------------------------------
def _noop_launches(rt, monkeypatch):
    calls = []
    monkeypatch.setattr(
        rt, "launch", lambda fn, *a, **k: calls.append(getattr(fn, "_minfer_name", fn))
    )
    return calls


def test_skipped_gemm_and_dequant_read_nan_not_stale(rt, tiny, monkeypatch):
    from minfer.cuda.paths.f16.gemm import gemm_f16_nt
    from minfer.cuda.paths.f16.upload import dequant_f16  # the upload's adapter
    from minfer.cuda.runtime import devarray as da

    def gemm(C, A, W):  # what the f16 route does: poison the output, then the GEMM
        da.poison(rt, C)
        gemm_f16_nt(A, W, np.float32, out=C, rt=rt)

    rng = np.random.default_rng(0)
    A = da.to_device(rt, rng.standard_normal((16, 64)).astype(np.float16), "A")
    W = da.to_device(rt, rng.standard_normal((32, 64)).astype(np.float16), "W")
    stale = np.full((16, 32), 1.5, np.float32)  # plausible numbers from "a previous call"
    C = da.to_device(rt, stale, "C")
    t = tiny.tensor("blk.0.ffn_down.weight")  # a quantized weight for the dequant adapter
    N, K = t.shape
    raw = da.to_device(rt, np.ascontiguousarray(t.data).view(np.uint8).reshape(-1), "raw")
    D = da.to_device(rt, np.ones((N, K), np.float16), "D")

    calls = _noop_launches(rt, monkeypatch)
    monkeypatch.setattr(rt.cfg, "poison", False)
    gemm(C, A, W)
    dequant_f16(rt, int(raw.gpudata), t.qtype, N, K, D)
    rt.synchronize()
    assert len(calls) >= 2  # the GEMM's and the dequant's launches were skipped...
    assert np.array_equal(C.get(), stale)  # ...and without poison the stale values remain
    assert np.all(D.get() == 1)

    monkeypatch.setattr(rt.cfg, "poison", True)
    gemm(C, A, W)
    dequant_f16(rt, int(raw.gpudata), t.qtype, N, K, D)
    rt.synchronize()
    assert np.isnan(C.get()).all() and np.isnan(D.get().astype(np.float32)).all()

    monkeypatch.undo()  # real launches again (poison on): the product overwrites the NaN
    monkeypatch.setattr(rt.cfg, "poison", True)
    gemm(C, A, W)
    ref = A.get().astype(np.float32) @ W.get().astype(np.float32).T
    np.testing.assert_allclose(C.get(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    "gemm,graphs", [("f16", True), ("f16", False), ("wide-kd4", True), ("blk", True)]
)
def test_poison_changes_no_result(rt, tiny, monkeypatch, gemm, graphs):
    """Every poisoned buffer is fully written before it is read: logits bit-identical."""
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    rng = np.random.default_rng(1)
    prompt = rng.integers(0, tiny.config.vocab_size, 21).astype(np.int32)

    def run():
        be = CudaBackend(tiny, GemmChoice(gemm), rt=rt, max_tokens=64, ubatch=16, graphs=graphs)
        out = [be.forward(prompt[:16], 0), be.forward(prompt[16:], 16)]
        t = int(np.argmax(out[-1]))
        for i in range(3):
            out.append(be.forward(np.array([t], np.int32), 21 + i))
            t = int(np.argmax(out[-1]))
        am = be.argmax_last()
        return np.stack(out), am

    monkeypatch.setattr(rt.cfg, "poison", False)
    plain, am0 = run()
    monkeypatch.setattr(rt.cfg, "poison", True)
    poisoned, am1 = run()
    assert np.all(np.isfinite(plain))
    assert np.array_equal(plain, poisoned)
    assert am0 == am1 == int(np.argmax(plain[-1]))


def test_skipped_launches_raise_non_finite_logits(rt, tiny, monkeypatch):
    from minfer.cuda.backend import CudaBackend

    prompt = np.arange(5, dtype=np.int32)
    monkeypatch.setattr(rt.cfg, "poison", False)
    be = CudaBackend(tiny, rt=rt, max_tokens=64, ubatch=16, graphs=False)
    good = be.forward(prompt, 0)
    be.reset()
    calls = _noop_launches(rt, monkeypatch)
    stale = be.forward(prompt, 0)  # without poison: nothing ran, yet plausible numbers come back
    assert calls and np.array_equal(stale, good)

    monkeypatch.setattr(rt.cfg, "poison", True)
    be.reset()
    with pytest.raises(
        GPUError,
        match=r"non-finite logits from the CUDA path \(1024 of 1024 "
        r"NaN/inf at positions 0\.\.4",
    ):
        be.forward(prompt, 0)


def test_check_reports_skipped_launches_as_failures(rt, tiny_path, monkeypatch):
    from click.testing import CliRunner

    from minfer.commands.check import check

    before = rt.cfg.poison
    _noop_launches(rt, monkeypatch)
    r = CliRunner().invoke(check, ["-m", str(tiny_path), "--identity-only", "-p", "hello"])
    assert r.exit_code == 1, r.output
    from minfer.cuda.paths import TABLE

    # every path, its identity row and its batch row
    assert f"check: {2 * len(TABLE)} FAILED" in r.output, r.output
    assert "non-finite logits" in r.output, r.output
    assert "Traceback" not in r.output
    assert rt.cfg.poison == before  # check turned poison on for itself only


def _nan_q8_0_scale(a):  # Q8_0 block: f16 scale d at bytes 0..1, then 32 int8
    a[0, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)


@pytest.mark.parametrize(
    "name, edit, where",
    [
        ("blk.1.ffn_down.weight", _nan_q8_0_scale, "layer 1 (blk.1)"),
        ("blk.0.attn_norm.weight", lambda a: a.__setitem__(7, np.nan), "layer 0 (blk.0)"),
        ("token_embd.weight", lambda a: a.__setitem__(slice(None), np.inf), "the token embedding"),
        ("output_norm.weight", lambda a: a.__setitem__(0, np.nan), "the output layer"),
    ],
)
@pytest.mark.parametrize("graphs", [True, False])
def test_non_finite_logits_name_the_first_bad_layer(rt, tmp_path, name, edit, where, graphs):
    """A NaN/inf weight: forward raises naming where the residual first went non-finite (the
    CPU reference names the same layer: tests/test_numerics_cpu.py)."""
    from synth_data import small_parts, write_small

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.gguf.loader import load_model

    meta, tensors = small_parts(
        seed=3, tied=False, d_model=128, d_ff=256, n_heads=2, n_kv_heads=1
    )  # head_dim 64
    tensors = [
        (n, q, s, (lambda d: (edit(d), d)[1])(np.array(d, copy=True)) if n == name else d)
        for n, q, s, d in tensors
    ]
    model = load_model(write_small(tmp_path / "m.gguf", meta, tensors))
    be = CudaBackend(
        model, GemmChoice("f16"), rt=rt, max_tokens=32, ubatch=8, graphs=graphs, warmup=False
    )  # (a warm-up forward would raise before the check)
    with pytest.raises(GPUError, match=re.escape(f"first non-finite: {where}")):
        be.forward(np.arange(1, 12, dtype=np.int32), 0)  # two chunks: the probe spans both
