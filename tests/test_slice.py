"""minfer.gguf.slice / scripts/slice_model.py: first N layers, metadata kept, the size cap honoured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import BadInput
from minfer.gguf.header import read_header, tensor_bytes
from minfer.gguf.loader import load_model
from minfer.gguf.slice import plan_slice, slice_model

REPO = Path(__file__).resolve().parent.parent
MIB = 2**20


def test_two_layers_of_the_default_model(default_model_path, tmp_path):
    out = tmp_path / "s2.gguf"
    plan = slice_model(default_model_path, out, layers=2)
    assert plan.layers == 2 and plan.total_layers == 30
    assert out.stat().st_size == plan.bytes <= 60 * MIB
    m = load_model(out)  # checks every tensor of the 2 layers
    assert m.config.n_layers == 2 and m.config.vocab_size == 49152
    assert not any(n.startswith("blk.2.") for n in m.tensors)
    src, dst = read_header(default_model_path), read_header(out)
    # metadata: all of it, with its types, block_count excepted
    assert dst.kv["llama.block_count"].value == 2
    assert dst.kv["llama.block_count"].type == src.kv["llama.block_count"].type
    for k, v in src.kv.items():
        if k != "llama.block_count":
            assert (dst.kv[k].value, dst.kv[k].type, dst.kv[k].sub_type) == (
                v.value,
                v.type,
                v.sub_type,
            ), k
    # tensors: the kept ones byte for byte
    by = {t.name: t for t in src.tensors}
    assert [t.name for t in dst.tensors] == [
        t.name for t in src.tensors if t.name in {d.name for d in dst.tensors}
    ]
    for t in dst.tensors:
        s = by[t.name]
        assert (t.qtype, t.shape) == (s.qtype, s.shape)
        assert np.array_equal(tensor_bytes(out, t), tensor_bytes(default_model_path, s)), t.name
    assert m.reader.fields["llama.block_count"].contents() == 2  # gguf's own reader agrees


def test_default_cap_picks_the_largest_n_that_fits(default_model_path, tmp_path):
    out = tmp_path / "s.gguf"
    plan = slice_model(default_model_path, out)  # --max-mib 60
    assert 1 <= plan.layers < 30
    assert out.stat().st_size == plan.bytes <= 60 * MIB
    with pytest.raises(BadInput, match="over the 60 MiB cap"):
        plan_slice(default_model_path, layers=plan.layers + 1)
    h = read_header(out)  # (loading is tested above; the reader is slow on a 49152 vocab)
    assert h.kv["llama.block_count"].value == plan.layers
    assert {int(t.name.split(".")[1]) for t in h.tensors if t.name.startswith("blk.")} == set(
        range(plan.layers)
    )
    # a smaller cap gives fewer layers, still under it
    p2 = plan_slice(default_model_path, max_mib=40)
    assert p2.layers < plan.layers and p2.bytes <= 40 * MIB


def test_cap_too_small_for_one_layer_is_a_clear_error(default_model_path, tmp_path):
    with pytest.raises(BadInput, match="even 1 layer"):
        slice_model(default_model_path, tmp_path / "x.gguf", max_mib=10)
    with pytest.raises(BadInput, match="choose 1..30"):
        slice_model(default_model_path, tmp_path / "x.gguf", layers=31)
    assert list(tmp_path.iterdir()) == []


def test_script(default_model_path, tmp_path):
    out = tmp_path / "s.gguf"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "slice_model.py"),
            str(default_model_path),
            str(out),
            "--layers",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "1 of 30 layers" in r.stdout and out.exists()
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "slice_model.py"),
            str(default_model_path),
            str(tmp_path / "y.gguf"),
            "--max-mib",
            "5",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: even 1 layer")
