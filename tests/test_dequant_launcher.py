"""CPU: the dequant launchers' validation and launch geometry, with a recording fake runtime,
and the numpy twins' shapes and NaN rows."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from minfer.cuda.ops.dequant import (
    DequantConfig,
    dequant_f16,
    dequant_f16_ref,
    embed_rows,
    embed_rows_ref,
    kernel_suffix,
)
from minfer.errors import BadInput, GPUError, Unsupported
from minfer.quants import BY_NAME, SUPPORTED
from minfer.quants.testdata import random_raw


class FakeRT:
    sm_count = 132

    def __init__(self):
        self.launches = []

    def function(self, name, entry, options=(), dyn_smem=0):
        return (name, entry)

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append((fn, grid, block, args))

    def alloc(self, nbytes, what="buffer"):
        return 1 << 20


class Buf:
    def __init__(self, addr, nbytes):
        self.gpudata, self.nbytes = addr, nbytes


def test_entry_names():
    names = {kernel_suffix(BY_NAME[n]) for n in SUPPORTED}
    assert {"q4_K", "q6_K", "iq4_xs", "bf16", "f32", "q8_0"} <= names
    from minfer.cuda.runtime.build import KERNEL_DIR

    src = KERNEL_DIR / "dequant.cu"
    text = src.read_text()
    for n in names:  # every supported type has its entry pair in the kernel file
        assert f"DQ_ENTRIES({n}, " in text


def test_dequant_launch_geometry():
    rt = FakeRT()
    t = BY_NAME["Q4_K"]
    out = dequant_f16(rt, Buf(4096, 14336 * 4096 // 256 * 144), t.qtype, 14336, 4096)
    ((fn, grid, block, args),) = rt.launches
    assert fn == ("dequant", "dq_f16_q4_K") and block == (256,)
    assert grid == (14336 * 4096 // 8192,)  # default: one CTA per 8192-output item
    assert int(args[0]) == 4096 and int(args[1]) == 14336 * 16 * 144
    assert int(args[2]) == out and int(args[3]) == 14336 * 4096
    rt = FakeRT()  # persistent grid, capped by the work
    dequant_f16(rt, 4096, t.qtype, 3, 8192 + 256, cfg=DequantConfig(ctas_per_sm=8))
    assert rt.launches[0][1] == (-(-3 * (8192 + 256) // 8192),)
    dequant_f16(rt, 4096, t.qtype, 14336, 4096, cfg=DequantConfig(ctas_per_sm=8))
    assert rt.launches[1][1] == (132 * 8,)


def test_embed_launch_args():
    rt = FakeRT()
    t = BY_NAME["Q8_0"]
    embed_rows(
        rt, Buf(4096, 49152 * 612), t.qtype, Buf(256, 40), 10, 576, Buf(8192, 10 * 576 * 4), V=49152
    )
    ((fn, grid, block, args),) = rt.launches
    assert fn == ("dequant", "embed_q8_0") and grid == (10,)
    assert [int(a) for a in args] == [4096, 49152 * 612, 612, 49152, 256, 10, 8192, 576]


def test_validation_errors():
    rt = FakeRT()
    q4k = BY_NAME["Q4_K"].qtype
    with pytest.raises(Unsupported, match="IQ2_XXS"):
        dequant_f16(rt, 4096, int(gguf.GGMLQuantizationType.IQ2_XXS), 1, 256)
    with pytest.raises(Unsupported, match="multiple of its block size"):
        dequant_f16(rt, 4096, q4k, 1, 300)
    with pytest.raises(BadInput, match="bad shape"):
        dequant_f16(rt, 4096, q4k, -1, 256)
    with pytest.raises(GPUError, match="aligned"):
        dequant_f16(rt, 4098, q4k, 1, 256)
    with pytest.raises(GPUError, match="needs 288 B"):
        dequant_f16(rt, Buf(4096, 287), q4k, 2, 256)
    with pytest.raises(GPUError, match="output"):
        dequant_f16(rt, 4096, q4k, 2, 256, out_dev=Buf(4096, 1023))
    with pytest.raises(BadInput, match="V="):
        embed_rows(rt, 4096, q4k, 256, 1, 256, 8192, V=0)
    with pytest.raises(GPUError, match="ids"):
        embed_rows(rt, 4096, q4k, Buf(256, 4), 2, 256, 8192, V=4)
    assert rt.launches == []
    dequant_f16(rt, 4096, q4k, 0, 256, out_dev=8192)  # empty: nothing launched
    assert rt.launches == []


def test_twins():
    rng = np.random.default_rng(0)
    for name in SUPPORTED:
        t = BY_NAME[name]
        K = max(t.block_size, 256)
        raw = random_raw(t.qtype, 5, K, rng)
        ref = dequant_f16_ref(raw, t.qtype, 5, K)
        assert ref.shape == (5, K) and ref.dtype == np.float16
        emb = embed_rows_ref(raw, t.qtype, np.array([4, -1, 0, 5]), K)
        assert emb.dtype == np.float32 and emb.shape == (4, K)
        with np.errstate(over="ignore"):  # wild finite scales overflow f16: inf, as defined
            assert emb[0].astype(np.float16).tobytes() == ref[4].tobytes()
        assert emb[2].tobytes() == embed_rows_ref(raw, t.qtype, [0], K)[0].tobytes()
        assert np.isnan(emb[1]).all() and np.isnan(emb[3]).all()
