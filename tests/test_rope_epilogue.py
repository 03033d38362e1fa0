"""The qkv GEMM's rope epilogue (gemm mode 4) without a GPU: the RopeQkv struct's numpy dtype
against kernels/rope.cuh's static_assert, the numpy twin's properties, which layers plan_rope
picks, and the tuning variant f16:no-rope."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from minfer.cuda.paths.f16.gemm import RopeRef, gemm_f16_nt_ref
from minfer.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]


def test_rope_qkv_dtype_matches_the_struct():
    from minfer.cuda.ops.layers import ROPE_QKV_DTYPE

    src = (ROOT / "kernels" / "rope.cuh").read_text()
    size = int(re.search(r"sizeof\(RopeQkv\) == (\d+)", src).group(1))
    offs = dict(re.findall(r"offsetof\(RopeQkv, (\w+)\) == (\d+)", src))
    assert ROPE_QKV_DTYPE.itemsize == size == 64
    assert offs and all(ROPE_QKV_DTYPE.fields[f][1] == int(o) for f, o in offs.items())
    # the struct's fields in order: six pointers, then four int32
    body = re.search(r"struct RopeQkv \{(.*?)\};", src, re.S).group(1)
    names = re.findall(r"(\w+);", body.replace("int qd, kd, D, half_r;", "qd; kd; D; half_r;"))
    assert names == ["q16", "kc", "vc", "cos_t", "sin_t", "tok", "qd", "kd", "D", "half_r"]
    assert [ROPE_QKV_DTYPE.fields[n][0].itemsize for n in ROPE_QKV_DTYPE.names] == [8] * 6 + [4] * 4


def test_twin_rotates_q_and_k_and_copies_v():
    rng = np.random.default_rng(0)
    M, K, Hq, Hkv, D, rd = 9, 40, 3, 1, 16, 12
    qd, kd = Hq * D, Hkv * D
    a = rng.standard_normal((M, K)).astype(np.float16)
    w = (rng.standard_normal((qd + 2 * kd, K)) * 0.2).astype(np.float16)
    c = a.astype(np.float32) @ w.astype(np.float32).T
    q, k, v = gemm_f16_nt_ref(a, w, rope=RopeRef(qd, kd, D, rd, 10000.0, pos0=0))
    assert q.dtype == k.dtype == v.dtype == np.float16
    assert q.shape == (M, qd) and k.shape == v.shape == (M, kd)
    assert np.array_equal(v, c[:, qd + kd :].astype(np.float16))
    # position 0: angle 0, q and k are the product rounded to f16
    assert np.array_equal(q[0], c[0, :qd].astype(np.float16))
    assert np.array_equal(k[0], c[0, qd : qd + kd].astype(np.float16))
    # later positions: the rotated pairs keep their norm; pairs past rope_dim pass through
    qh, ch = q.reshape(M, Hq, D).astype(np.float64), c[:, :qd].reshape(M, Hq, D)
    assert np.array_equal(q.reshape(M, Hq, D)[:, :, rd:], ch[:, :, rd:].astype(np.float16))
    n_got = qh[:, :, 0:rd:2] ** 2 + qh[:, :, 1:rd:2] ** 2
    n_ref = ch[:, :, 0:rd:2].astype(np.float64) ** 2 + ch[:, :, 1:rd:2].astype(np.float64) ** 2
    assert np.allclose(n_got, n_ref, rtol=5e-3, atol=1e-3)
    assert not np.array_equal(q[1:, :rd], c[1:, :rd].astype(np.float16))
    # pos0 shifts the angles: row t at pos0 = 3 is row 3 + t at pos0 = 0
    q3, _, _ = gemm_f16_nt_ref(a[:1], w, rope=RopeRef(qd, kd, D, rd, 10000.0, pos0=3))
    a4 = np.concatenate([a[1:4], a[:1]])
    q0, _, _ = gemm_f16_nt_ref(a4, w, rope=RopeRef(qd, kd, D, rd, 10000.0, pos0=0))
    assert np.array_equal(q3[0], q0[3])
    with pytest.raises(BadInput, match="rope needs N"):
        gemm_f16_nt_ref(a, w[:-8], rope=RopeRef(qd, kd, D, rd, 10000.0))


def test_plan_rope_and_variant(tmp_path):
    from synth_data import tiny_model

    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.fusion import plan_fusion, plan_rope
    from minfer.cuda.plan.routes import plan_routes
    from minfer.gguf.loader import load_model

    class _Rt:
        arch, smem_optin = "sm_90", 232448

    m = load_model(tiny_model(tmp_path, seed=3, workers=None))
    r16 = plan_routes(m, GemmChoice("f16"), _Rt(), 64)
    fused = plan_fusion(m, r16)
    groups = plan_rope(m, GemmChoice(), r16, fused)
    assert groups == {f"blk.{i}.attn_qkv.weight" for i in range(m.config.n_layers)}
    # the tuning variant f16:no-rope (bench --ab) keeps the rope launch
    assert not plan_rope(m, GemmChoice.parse_ab("f16:no-rope", env={}), r16, fused)
    # int8 routes keep the rope launch
    rq = plan_routes(m, GemmChoice("blk"), _Rt(), 64)
    assert not plan_rope(m, GemmChoice("blk"), rq, plan_fusion(m, rq))
    # neox models (adjacent pairs only) and q/k/v biases keep it too
    from dataclasses import replace

    class _M:
        def __init__(self, cfg):
            self.config = cfg

    assert not plan_rope(_M(replace(m.config, rope_neox=True)), GemmChoice(), r16, fused)
    assert not plan_rope(_M(replace(m.config, qkv_bias=True)), GemmChoice(), r16, fused)


def test_rope_epilogue_where_the_tiles_fit_one_wave():
    # 8B qkv (N = 6144) on 132 SMs: M = 512 is 128 tiles of 128 x 192 (measured 1.04x), M = 2048
    # 384 of 128 x 256 (0.98x): the epilogue only where the tiles fit one wave; never at M = 1
    from minfer.cuda.paths.f16.gemm import rope_epilogue_pays

    assert rope_epilogue_pays(512, 6144, 132, "sm_90")
    assert not rope_epilogue_pays(2048, 6144, 132, "sm_90")
    assert not rope_epilogue_pays(1024, 6144, 132, "sm_90")
    assert not rope_epilogue_pays(1, 6144, 132, "sm_90")
    assert rope_epilogue_pays(16, 576, 132, "sm_90")  # small models: one wave at any chunk
    assert rope_epilogue_pays(32, 6144, 132, "sm_80")  # 96 blocks of the 32 x 64 tile
    assert not rope_epilogue_pays(64, 6144, 132, "sm_80")  # 192
