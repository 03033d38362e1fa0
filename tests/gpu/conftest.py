"""GPU test fixtures (tests here skip without a GPU): `rt`, the process's minfer Runtime,
`hopper`, the same on an sm_90 GPU (skips elsewhere: the wgmma kernels), `same_bytes`
(a device array bitwise equal to its numpy twin), and `model`, the backend test models: a tiny synthetic Q4_K_M model made here (head_dim 64, GQA
4:2, every GEMM weight q4_K/q6_K) and, when MINFER_TEST_MODEL names one (e.g. the default model
sliced to fit a device call), that real GGUF too."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def rt():
    from minfer.cuda.runtime.runtime import get_runtime

    return get_runtime()


@pytest.fixture(scope="module")
def hopper(rt):
    if rt.arch != "sm_90":
        pytest.skip(f"wgmma kernels: sm_90 only, this GPU is {rt.arch}")
    return rt


def _same_bytes(dev, ref) -> bool:
    import numpy as np

    a, b = np.ascontiguousarray(dev.get()), np.ascontiguousarray(ref)
    return a.nbytes == b.nbytes and np.array_equal(
        a.view(np.uint8).ravel(), b.view(np.uint8).ravel()
    )


@pytest.fixture(scope="session")
def same_bytes():
    """f(device array, numpy twin) -> whether they hold the same bytes (any dtypes of equal
    size)."""
    return _same_bytes


def _models() -> list[str]:
    out = ["synth-tiny"]
    if os.environ.get("MINFER_TEST_MODEL"):
        out.append(os.environ["MINFER_TEST_MODEL"])
    return out


@pytest.fixture(scope="module", params=_models())
def model(request, tmp_path_factory):
    from minfer.gguf.loader import load_model

    if request.param == "synth-tiny":
        from synth_data import tiny_model

        return load_model(tiny_model(tmp_path_factory.mktemp("synth"), seed=3, workers=None))
    return load_model(request.param)
