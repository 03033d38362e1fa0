"""kernels/dequant.cu's per-type decoders run on the CPU (tests/native/dequant_host.cu, built with
nvcc as a host library): bit-identical to gguf's dequant for every type, no GPU needed.

The GPU tests (tests/gpu/test_dequant.py) cover the rest of the kernel: staging, tails, stores.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from minfer.cuda.ops.dequant import _dequant_rows, kernel_suffix
from minfer.quants import BY_NAME, SUPPORTED, traits_of
from minfer.quants.testdata import nan_aware_equal, random_raw

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = tmp_path_factory.mktemp("dqh") / "dequant_host.so"
    r = subprocess.run(
        [
            "nvcc",
            "-O2",
            "-std=c++17",
            "-arch=sm_80",
            "-Xcompiler",
            "-fPIC,-ffp-contract=off",
            "-shared",
            "-o",
            str(so),
            str(HERE / "native" / "dequant_host.cu"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(so))
    lib.dq_host.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p]
    return lib


def host_dequant(lib, raw: np.ndarray, qtype: int, N: int, K: int) -> np.ndarray:
    t = traits_of(qtype)
    src = np.zeros(raw.nbytes + 32, np.uint8)  # slack: float types read 8 values at a time
    src[: raw.nbytes] = raw.reshape(-1)
    out = np.empty((N, K), np.float32)
    rc = lib.dq_host(kernel_suffix(t).encode(), src.ctypes.data, N * K, out.ctypes.data)
    assert rc == 0, f"dq_host has no decoder for {t.name}"
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's numpy on NaN/Inf scales
@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("finite", [True, False])
def test_decoders_match_gguf(lib, name, finite):
    t = BY_NAME[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}{finite}".encode()))
    N, K = 7, 3 * max(t.block_size, 256)
    raw = random_raw(t.qtype, N, K, rng, finite=finite)
    got = host_dequant(lib, raw, t.qtype, N, K)
    want = _dequant_rows(raw, t, N, K)
    if finite:
        assert not np.isnan(want).any()
        assert got.tobytes() == want.tobytes(), nan_aware_equal(got, want)[1]
        # and the f16 cast (what dq_f16 stores) then agrees too
        assert got.astype(np.float16).tobytes() == want.astype(np.float16).tobytes()
    else:
        ok, msg = nan_aware_equal(got, want)
        assert ok, msg


def test_decoders_on_real_rows(lib):
    """Rows written by gguf's own quantizers from gaussian weights."""
    import gguf

    rng = np.random.default_rng(1)
    w = (rng.standard_normal((16, 512)) * 0.05).astype(np.float32)
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "F16"):
        t = BY_NAME[name]
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[name]).view(np.uint8)
        got = host_dequant(lib, raw, t.qtype, 16, 512)
        assert got.tobytes() == _dequant_rows(raw, t, 16, 512).tobytes(), name


def test_device_code_keeps_the_arithmetic(tmp_path):
    """PTX of every dequant entry: it reads shared memory, multiplies with mul.rn (8+ per
    thread step), and holds no FMA (contraction would change the rounding vs gguf). Catches
    decoders that nvcc optimized away (e.g. undefined behaviour) and FMA contraction, which
    the host-run decoders above cannot see."""
    import re

    from minfer.cuda.runtime.build import KERNEL_DIR

    ptx = tmp_path / "dequant.ptx"
    r = subprocess.run(
        [
            "nvcc",
            "-ptx",
            "-arch=sm_90",
            "-O3",
            "-std=c++17",
            "-I",
            str(KERNEL_DIR),
            "-o",
            str(ptx),
            str(KERNEL_DIR / "dequant.cu"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    bodies = dict(re.findall(r"\.entry (\w+)\((.*?)\n}", ptx.read_text(), re.S))
    for name in SUPPORTED:
        t = BY_NAME[name]
        for entry in (f"dq_f16_{kernel_suffix(t)}", f"embed_{kernel_suffix(t)}"):
            body = bodies[entry]
            assert "ld.shared" in body and "cp.async" in body, entry
            assert not re.search(r"\bfma\.", body), f"{entry}: FMA in the dequant arithmetic"
            if t.block_size > 1:
                assert len(re.findall(r"mul\.rn\.f32", body)) >= 8, entry
