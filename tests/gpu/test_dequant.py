"""GPU: dq_f16_<type> and embed_<type> (kernels/dequant.cu) through the production launchers.

Rule (minfer/quants/testdata.py): with finite scales, the output equals the numpy twin byte for
byte (memcmp); on raw random bytes (NaN/Inf scales possible), NaN positions must match and every
other element must be bit-identical. Outputs are poisoned (0xFF bytes: f16/f32 NaN) before each
launch, with a poisoned guard past the end, so an element not written (or written past the end)
fails the finite-scale comparison or the guard check.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from minfer.cuda.ops.dequant import (
    DequantConfig,
    dequant_f16,
    dequant_f16_ref,
    embed_rows,
    embed_rows_ref,
)
from minfer.errors import Unsupported
from minfer.quants import BY_NAME, SUPPORTED
from minfer.quants.testdata import nan_aware_equal, random_raw

pytestmark = pytest.mark.gpu

GUARD = 256  # poisoned bytes after each output


def _shapes(name: str) -> list[tuple[int, int]]:
    qk = BY_NAME[name].block_size
    if qk == 1:  # float types: any K, ragged tails, rows misaligned for vector stores
        return [(1, 1), (3, 7), (5, 13), (2, 4096 + 3), (37, 576), (9, 8192 + 8)]
    return [
        (1, qk),
        (3, qk),
        (7, 3 * qk),
        (37, 576 if 576 % qk == 0 else 2 * 256),
        (131, 8192 + qk),
        (2, 64 * qk),
    ]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _upload(rt, host: np.ndarray):
    buf = rt.alloc(host.nbytes, "test input")  # exact size: memcheck sees any over-read
    rt.drv.memcpy_htod(buf, np.ascontiguousarray(host))
    return buf


def _poisoned(rt, nbytes: int):
    buf = rt.alloc(nbytes + GUARD, "test output")
    rt.drv.memcpy_htod(buf, np.full(nbytes + GUARD, 0xFF, np.uint8))
    return buf


def _download(rt, buf, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    host = np.empty(nbytes + GUARD, np.uint8)
    rt.drv.memcpy_dtoh(host, buf)
    return host[:nbytes], host[nbytes:]


def run_dq(rt, raw: np.ndarray, qtype: int, N: int, K: int, cfg=None) -> np.ndarray:
    src = _upload(rt, raw)
    out = _poisoned(rt, N * K * 2)
    dequant_f16(rt, src, qtype, N, K, out_dev=out, cfg=cfg)
    rt.synchronize()
    got, guard = _download(rt, out, N * K * 2)
    assert (guard == 0xFF).all(), "dq_f16 wrote past the end of its output"
    return got.view(np.float16).reshape(N, K)


@pytest.mark.parametrize("name", SUPPORTED)
def test_dq_f16_bitwise_finite(rt, name):
    t = BY_NAME[name]
    for N, K in _shapes(name):
        raw = random_raw(t.qtype, N, K, np.random.default_rng(_seed(name, N, K)))
        want = dequant_f16_ref(raw, t.qtype, N, K)
        got = run_dq(rt, raw, t.qtype, N, K)
        assert got.tobytes() == want.tobytes(), (
            f"{name} [{N}, {K}]: " + nan_aware_equal(got, want)[1]
        )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's numpy on NaN/Inf scales
@pytest.mark.parametrize("name", SUPPORTED)
def test_dq_f16_raw_bytes_nan_aware(rt, name):
    t = BY_NAME[name]
    N, K = 19, 3 * max(t.block_size, 256)
    raw = random_raw(t.qtype, N, K, np.random.default_rng(_seed("raw", name)), finite=False)
    ok, msg = nan_aware_equal(run_dq(rt, raw, t.qtype, N, K), dequant_f16_ref(raw, t.qtype, N, K))
    assert ok, f"{name}: {msg}"


@pytest.mark.parametrize("ctas_per_sm", [0, 1, 2])
def test_dq_f16_grid_configs(rt, ctas_per_sm):
    """Persistent grids smaller than the work (many items per CTA, prefetch path) and one CTA
    per item give the same bits."""
    for name in ("Q4_K", "Q8_0", "F32"):
        t = BY_NAME[name]
        N, K = 1000, 4096  # 500+ items: with ctas_per_sm=1 each CTA walks ~4 (prefetch path)
        raw = random_raw(t.qtype, N, K, np.random.default_rng(_seed("grid", name)))
        got = run_dq(rt, raw, t.qtype, N, K, cfg=DequantConfig(ctas_per_sm=ctas_per_sm))
        assert got.tobytes() == dequant_f16_ref(raw, t.qtype, N, K).tobytes(), name


def test_dq_f16_real_quantizer_rows(rt):
    """Rows written by gguf's own quantizers (gaussian weights)."""
    import gguf

    w = (np.random.default_rng(3).standard_normal((96, 1024)) * 0.02).astype(np.float32)
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "F16", "F32"):
        t = BY_NAME[name]
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[name]).view(np.uint8)
        got = run_dq(rt, raw, t.qtype, 96, 1024)
        assert got.tobytes() == dequant_f16_ref(raw, t.qtype, 96, 1024).tobytes(), name


def test_dq_f16_real_model_rows(rt):
    """The default model's tensors (Q4_1 weights, Q8_0 embedding), where the file is present."""
    from minfer.gguf.fetch import default_model_path
    from minfer.gguf.loader import load_model

    try:
        path = default_model_path(fetch=False)
    except Exception:
        pytest.skip("default model not present")
    if not path.exists():
        pytest.skip("default model not present")
    m = load_model(path)
    for name in ("blk.0.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight"):
        ti = m.tensors[name]
        rows = np.ascontiguousarray(ti.data[:300]).view(np.uint8)
        N, K = rows.shape[0], ti.shape[1]
        got = run_dq(rt, rows, ti.qtype, N, K)
        assert got.tobytes() == dequant_f16_ref(rows, ti.qtype, N, K).tobytes(), name


@pytest.mark.parametrize("name", SUPPORTED)
def test_embed_rows_bitwise(rt, name):
    t = BY_NAME[name]
    qk = t.block_size
    for V, K in (
        [(50, 577), (3, 8)]
        if qk == 1
        else [(50, 576 if 576 % qk == 0 else 512), (3, qk), (4, 8192 + qk)]
    ):
        rng = np.random.default_rng(_seed("embed", name, K))
        table = random_raw(t.qtype, V, K, rng)
        ids = np.concatenate([rng.integers(0, V, 29), [0, V - 1, V - 1, -1, V, 2**31 - 1]])
        ids = ids.astype(np.int32)
        T = ids.size
        tab_dev, ids_dev = _upload(rt, table), _upload(rt, ids)
        out = _poisoned(rt, T * K * 4)
        embed_rows(rt, tab_dev, t.qtype, ids_dev, T, K, out, V=V)
        rt.synchronize()
        got, guard = _download(rt, out, T * K * 4)
        assert (guard == 0xFF).all(), "embed wrote past the end of its output"
        got = got.view(np.float32).reshape(T, K)
        want = embed_rows_ref(table, t.qtype, ids, K)
        valid = (ids >= 0) & (ids < V)
        assert got[valid].tobytes() == want[valid].tobytes(), (
            f"{name} K={K}: " + nan_aware_equal(got[valid], want[valid])[1]
        )
        assert np.isnan(got[~valid]).all(), f"{name}: out-of-range ids must give NaN rows"


def test_launcher_rejects_unsupported(rt):
    import gguf

    src = rt.alloc(1024)
    with pytest.raises(Unsupported, match="IQ2_XXS"):
        dequant_f16(rt, src, int(gguf.GGMLQuantizationType.IQ2_XXS), 1, 256)
    with pytest.raises(Unsupported, match="multiple of its block size"):
        dequant_f16(rt, src, BY_NAME["Q4_K"].qtype, 1, 300)
