"""The streaming weight upload on the GPU (minfer.cuda.runtime.upload, weights.load_weights):
a tiny chunk (every tensor split into many row ranges, each copied and dequantized / requantized
on its own) gives the same weights, bit for bit, and the same logits as the default 64 MiB
chunk, on every path the GPU runs; the memory plan's need is what the backend checks; the
upload rate is printed (the target is >= 5 GB/s on the H200 for a file in the page cache)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

TINY_CHUNK = 4096 + 256  # bytes: not a multiple of a row, so the chunks are ragged


def _weights(be) -> dict[str, bytes]:
    out = {}
    for n, v in be.w.items():
        arrays = v._arrays() if hasattr(v, "_arrays") else [v]  # prepared layouts: all arrays
        out[n] = b"".join(np.ascontiguousarray(a.get()).tobytes() for a in arrays)
    out["<embedding>"] = be.emb.get().tobytes()
    return out


@pytest.mark.parametrize("gemm", ["f16", "wide-kd4", "blk", "auto"])
def test_tiny_chunks_give_the_same_weights_and_logits(rt, model, gemm):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    if gemm == "blk" and rt.arch != "sm_90":
        pytest.skip("blk is sm_90 only")
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, 21).astype(np.int32)
    got = {}
    for chunk in (None, TINY_CHUNK):
        be = CudaBackend(
            model, GemmChoice(gemm), max_tokens=64, ubatch=32, warmup=False, chunk=chunk
        )
        assert be.upload_bytes > 0 and be.upload_s > 0
        got[chunk] = (_weights(be), be.forward(prompt, 0).copy(), be.memory.line())
        print(
            f"\n{model.path.name} {gemm} chunk {be.chunk}: {be.upload_bytes / 1e9:.3f} GB in "
            f"{be.upload_s:.3f} s; memory {be.memory.line()}"
        )
        del be
    (w0, l0, _), (w1, l1, _) = got[None], got[TINY_CHUNK]
    assert w0.keys() == w1.keys()
    bad = [n for n in w0 if w0[n] != w1[n]]
    assert not bad, f"weights differ with {TINY_CHUNK} B chunks: {bad[:5]}"
    assert np.array_equal(l0.view(np.uint32), l1.view(np.uint32))


def test_chunk_sizes_the_staging(rt, model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    be = CudaBackend(
        model,
        GemmChoice("f16"),
        max_tokens=32,
        ubatch=16,
        warmup=False,
        chunk=int(0.01 * (1 << 20)),
    )
    from minfer.cuda.plan.sizes import upload_slot

    assert be.chunk == int(0.01 * (1 << 20))
    assert be._plan()["upload staging"] == 2 * upload_slot(model, be.routes, be.chunk)


def test_memory_plan_is_what_the_backend_checks(rt, model):
    """auto's chosen tier's need equals the plan the backend checks and allocates by; the
    device's free memory is what the line names."""
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    be = CudaBackend(model, GemmChoice(), max_tokens=64, ubatch=32, warmup=False)
    assert be.memory.fits and be.memory.chosen == "f16"  # a test model fits any H200
    assert sum(be._plan().values()) == be.memory.need
    assert be.memory.line().startswith("f16 plan ") and "free" in be.memory.line()
