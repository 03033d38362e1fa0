"""llama.cpp's tensor type mix, the fallbacks, and the `minfer quantize` command end to end."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import gguf
import numpy as np
import pytest

from minfer.errors import Unsupported
from minfer.tools.quantize_mix import (
    MixModel,
    TensorDesc,
    describe,
    llama_order,
    plan_types,
    use_more_bits,
)
from tests.conftest import GOLDEN

KINDS = {
    "q4_K_M": "smollm2-135m-q4_k_m",
    "q6_K": "smollm2-135m-q6_k",
    "q8_0": "smollm2-135m-q8_0",
    "f16": "smollm2-135m-f16",
}


@pytest.fixture(scope="module")
def requant_golden():
    return json.loads((GOLDEN / "llamacpp-requant-tensors.json").read_text())


def _descs(model):
    return [TensorDesc(n, t.shape, t.type_name) for n, t in model.tensors.items()]


def _mix_model(model):
    c = model.config
    return MixModel(c.arch, c.n_layers, c.n_heads, c.n_kv_heads)


@pytest.mark.parametrize("ftype", list(KINDS))
def test_smollm2_mix_matches_llamacpp(default_model, requant_golden, ftype):
    types = plan_types(_descs(default_model), ftype, _mix_model(default_model))
    want = requant_golden[KINDS[ftype]]
    assert list(types) == list(want)  # llama.cpp's tensor order too
    assert {n: t for n, t in types.items()} == {n: e["type"] for n, e in want.items()}


def test_smollm2_mix_matches_tensor_types_json(default_model):
    tt = json.loads((GOLDEN / "tensor_types.json").read_text())
    types = plan_types(_descs(default_model), "q4_K_M", _mix_model(default_model))
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    assert counts == tt["q4_k_m"]["tensor_type_counts"]


def _llama8b(tied=False):
    n, d, ff = 32, 4096, 14336
    ts = [
        TensorDesc("token_embd.weight", (128256, d), "F16"),
        TensorDesc("output_norm.weight", (d,), "F32"),
    ]
    if not tied:
        ts.append(TensorDesc("output.weight", (128256, d), "F16"))
    for i in range(n):
        p = f"blk.{i}."
        ts += [
            TensorDesc(p + "attn_norm.weight", (d,), "F32"),
            TensorDesc(p + "attn_q.weight", (d, d), "F16"),
            TensorDesc(p + "attn_k.weight", (1024, d), "F16"),
            TensorDesc(p + "attn_v.weight", (1024, d), "F16"),
            TensorDesc(p + "attn_output.weight", (d, d), "F16"),
            TensorDesc(p + "ffn_norm.weight", (d,), "F32"),
            TensorDesc(p + "ffn_gate.weight", (ff, d), "F16"),
            TensorDesc(p + "ffn_up.weight", (ff, d), "F16"),
            TensorDesc(p + "ffn_down.weight", (d, ff), "F16"),
        ]
    return ts, MixModel("llama", n, 32, 8)


def test_llama8b_preset_table():
    ts, mm = _llama8b()
    more = {i for i in range(32) if use_more_bits(i, 32)}
    assert more == {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
    for ftype in ("q4_K_M", "q4_K_S", "q6_K", "q8_0", "f16"):
        types = plan_types(ts, ftype, mm)
        print(f"\n--- Llama-3-8B shape, {ftype}\n{describe(types)}")
        assert types["output_norm.weight"] == "F32"
        if ftype == "q4_K_M":
            assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
            for i in range(32):
                want = "Q6_K" if i in more else "Q4_K"
                assert types[f"blk.{i}.attn_v.weight"] == want
                assert types[f"blk.{i}.ffn_down.weight"] == want
                assert types[f"blk.{i}.attn_q.weight"] == "Q4_K"
        if ftype == "q4_K_S":
            for i in range(32):
                want = "Q5_K" if i < 4 else "Q4_K"
                assert types[f"blk.{i}.attn_v.weight"] == want
                assert types[f"blk.{i}.ffn_down.weight"] == want
        if ftype == "q6_K":
            assert set(types.values()) == {"F32", "Q6_K"}
        if ftype in ("q8_0", "f16"):
            assert set(types.values()) == {"F32", {"q8_0": "Q8_0", "f16": "F16"}[ftype]}


def test_tied_embedding_is_quantized_as_output():
    ts, mm = _llama8b(tied=True)
    assert plan_types(ts, "q4_K_M", mm)["token_embd.weight"] == "Q6_K"
    ts, mm = _llama8b(tied=False)
    assert plan_types(ts, "q4_K_M", mm)["token_embd.weight"] == "Q4_K"


@pytest.mark.parametrize(
    "ftype,cols,want",
    [
        ("q4_K_M", 576, "Q5_0"),
        ("q5_K_S", 576, "Q5_1"),
        ("q6_K", 576, "Q8_0"),
        ("q4_K_M", 48, "F16"),
        ("q4_K_M", 512, "Q4_K"),
    ],
)
def test_fallback_table(ftype, cols, want):
    ts = [TensorDesc("blk.0.attn_q.weight", (64, cols), "F32")]
    assert plan_types(ts, ftype, MixModel("llama", 1, 1, 1))["blk.0.attn_q.weight"] == want


def test_no_fallback_for_legacy_types():
    ts = [TensorDesc("blk.0.attn_q.weight", (64, 48), "F32")]
    with pytest.raises(Unsupported, match="no fallback"):
        plan_types(ts, "q8_0", MixModel("llama", 1, 1, 1))


def test_llama_order():
    names = ["blk.10.a", "blk.2.b", "output.weight", "blk.2.a", "token_embd.weight"]
    assert llama_order(names) == [
        "output.weight",
        "token_embd.weight",
        "blk.2.a",
        "blk.2.b",
        "blk.10.a",
    ]


# --- the command ---------------------------------------------------------------------------------


def _cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "minfer", *args],
        capture_output=True,
        text=True,
        timeout=kw.pop("timeout", 300),
        **kw,
    )


def test_cli_errors(tmp_path, default_model_path):
    r = _cli("quantize", str(default_model_path), str(tmp_path / "o.gguf"), "--type", "q3_K_X")
    assert r.returncode == 1 and "q3_K_X" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    r = _cli("quantize", str(bad), str(tmp_path / "o.gguf"), "--type", "q8_0")
    assert r.returncode == 2 and r.stderr.startswith("error:") and "not a GGUF" in r.stderr
    r = _cli(
        "quantize", str(default_model_path), str(tmp_path / "nodir" / "o.gguf"), "--type", "q8_0"
    )
    assert r.returncode == 2 and "does not exist" in r.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):  # (root can write anywhere)
            r = _cli("quantize", str(default_model_path), str(ro / "o.gguf"), "--type", "q8_0")
            assert r.returncode == 2 and "not writable" in r.stderr
    finally:
        ro.chmod(0o700)
    r = _cli("quantize", str(default_model_path), str(default_model_path), "--type", "q8_0")
    assert r.returncode == 2 and "overwrite the input" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "ro"]


def test_cli_interrupt_leaves_nothing(tmp_path, default_model_path):
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minfer",
            "quantize",
            str(default_model_path),
            str(tmp_path / "o.gguf"),
            "--type",
            "q4_K_M",
            "--quiet",
            "--allow-requantize",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not any(tmp_path.iterdir()):
        time.sleep(0.05)  # wait until the temporary file exists: writing has begun
    assert any(tmp_path.iterdir()), "no temporary output appeared"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert list(tmp_path.iterdir()) == []


def _sha_by_tensor(path):
    r = gguf.GGUFReader(str(path))
    return {
        t.name: (t.tensor_type.name, hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest())
        for t in r.tensors
    }, r


@pytest.mark.slow
def test_cli_q4_K_M_matches_llamacpp(requant_q4_k_m, requant_golden):
    out = requant_q4_k_m  # `minfer quantize IN OUT --type Q4_K_M`, made once per session
    got, reader = _sha_by_tensor(out)
    want = requant_golden["smollm2-135m-q4_k_m"]
    assert list(got) == list(want)
    same = [n for n in want if got[n] == (want[n]["type"], want[n]["sha256"])]
    assert len(same) == len(want), f"{len(same)}/{len(want)} identical"
    assert reader.fields["general.file_type"].contents() == 15
    assert out.stat().st_size == 105_454_144  # llama.cpp's file size
    assert [p.name for p in out.parent.iterdir()] == ["q4km.gguf"]  # no temporary left


def test_drain_stops_a_pool_without_killing_workers():
    """requant._drain (the Ctrl-C / write-error path): with the stop event set, the queued
    chunks are skipped (None), the workers exit on their own, and the pool closes; never
    Pool.terminate() on a worker that may be sending a result (that hung: a partial message)."""
    import multiprocessing as mp

    from minfer.tools import quantize as requant

    ctx = mp.get_context("fork")
    stop = ctx.Event()
    stop.set()  # before any chunk runs: the workers have no model (forked=True, none loaded)
    with ctx.Pool(2, initializer=requant._worker_init, initargs=("", True, stop)) as pool:
        it = pool.imap(requant._work, [("t", 0, 1, "q4_K")] * 50)
        t0 = time.time()
        requant._drain(pool, stop)
        assert time.time() - t0 < 30
        assert list(it) == [None] * 50
        assert not [p for p in mp.active_children() if "PoolWorker" in p.name]
