"""minfer.gguf.write: byte-exact round trip, metadata types kept, streaming order, atomicity."""

from __future__ import annotations

import filecmp

import gguf
import numpy as np
import pytest

from minfer.errors import BadInput
from minfer.gguf.header import read_header, tensor_bytes
from minfer.gguf.write import metadata_from_reader, write_gguf

V = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType


def test_round_trip_of_the_default_model_is_byte_identical(default_model_path, tmp_path):
    h = read_header(default_model_path)
    out = tmp_path / "copy.gguf"
    tensors = [(t.name, t.qtype, t.shape, tensor_bytes(default_model_path, t)) for t in h.tensors]
    write_gguf(out, h.kv["general.architecture"].value, h.kv, tensors, progress=False)
    assert filecmp.cmp(default_model_path, out, shallow=False)


def _small_file(path):
    rng = np.random.default_rng(0)
    q8 = np.zeros((4, 34 * 2), np.uint8)  # 4 rows of 64 Q8_0 values
    q8[:, 2:34] = rng.integers(0, 256, (4, 32))
    meta = {
        "llama.block_count": 7,  # plain int -> UINT32 (llama.cpp reads it as uint32)
        "llama.rope.freq_base": 500000.0,  # float -> FLOAT32
        "general.name": "t",
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.tokens": ["a", "b", "c"],
        "tokenizer.ggml.token_type": [1, 1, 3],  # int list -> INT32 array
        "tokenizer.ggml.scores": [0.0, -1.5, 2.0],
        "x.negative": -3,
        "x.big": 2**40,
        "x.explicit_u64": gguf.GGUFValue(5, V.UINT64),
        "x.explicit_i8_array": gguf.GGUFValue([1, -2], V.ARRAY, V.INT8),
    }
    tensors = [
        ("a.weight", Q.F32, (3, 5), np.arange(15, dtype=np.float32).reshape(3, 5)),
        ("b.weight", Q.F16, (2, 4), np.ones((2, 4), np.float16)),
        ("c.weight", Q.Q8_0, (4, 64), q8),
    ]
    write_gguf(path, "llama", meta, tensors, progress=False)
    return meta, tensors


def test_plain_values_get_llama_cpp_types_and_explicit_types_are_kept(tmp_path):
    p = tmp_path / "t.gguf"
    _small_file(p)
    f = gguf.GGUFReader(p).fields
    expect = {
        "general.architecture": [V.STRING],
        "llama.block_count": [V.UINT32],
        "llama.rope.freq_base": [V.FLOAT32],
        "general.name": [V.STRING],
        "tokenizer.ggml.add_bos_token": [V.BOOL],
        "tokenizer.ggml.tokens": [V.ARRAY, V.STRING],
        "tokenizer.ggml.token_type": [V.ARRAY, V.INT32],
        "tokenizer.ggml.scores": [V.ARRAY, V.FLOAT32],
        "x.negative": [V.INT32],
        "x.big": [V.UINT64],
        "x.explicit_u64": [V.UINT64],
        "x.explicit_i8_array": [V.ARRAY, V.INT8],
    }
    for k, types in expect.items():
        assert list(f[k].types) == types, k
    assert f["tokenizer.ggml.token_type"].contents() == [1, 1, 3]
    assert f["x.explicit_i8_array"].contents() == [1, -2]
    assert f["x.big"].contents() == 2**40


def test_metadata_copied_from_a_reader_keeps_every_type_and_value(tmp_path):
    p, p2 = tmp_path / "t.gguf", tmp_path / "t2.gguf"
    _, tensors = _small_file(p)
    r = gguf.GGUFReader(p)
    write_gguf(p2, "llama", metadata_from_reader(r), tensors, progress=False)
    assert filecmp.cmp(p, p2, shallow=False)
    # the fast header parser reads the same typed values as gguf's reader
    fast = read_header(p2).kv
    slow = metadata_from_reader(gguf.GGUFReader(p2))
    assert list(fast) == list(slow)
    for k in slow:
        assert (fast[k].value, fast[k].type, fast[k].sub_type) == (
            slow[k].value,
            slow[k].type,
            slow[k].sub_type,
        ), k


def test_tensors_come_back_with_numpy_shapes_and_values(tmp_path):
    p = tmp_path / "t.gguf"
    _, tensors = _small_file(p)
    r = gguf.GGUFReader(p)
    by = {t.name: t for t in r.tensors}
    for name, qt, shape, data in tensors:
        t = by[name]
        assert int(t.tensor_type) == int(qt)
        assert tuple(int(x) for x in reversed(t.shape)) == shape
        assert t.data.tobytes() == data.tobytes()


def test_callables_are_called_once_in_order_after_the_header(tmp_path):
    p = tmp_path / "t.gguf"
    calls = []

    def make(i):
        def f():
            calls.append(i)
            # the header and earlier tensors are on disk already: nothing is buffered
            tmp = list(tmp_path.glob(".t.gguf.tmp-*"))
            assert len(tmp) == 1 and tmp[0].stat().st_size > 0
            return np.full((2, 8), i, np.float32)

        return f

    write_gguf(
        p, "llama", {}, [(f"t{i}", Q.F32, (2, 8), make(i)) for i in range(5)], progress=False
    )
    assert calls == [0, 1, 2, 3, 4]
    r = gguf.GGUFReader(p)
    assert [float(t.data.ravel()[0]) for t in r.tensors] == [0, 1, 2, 3, 4]


def test_a_failure_mid_write_leaves_no_file_and_keeps_the_old_one(tmp_path):
    p = tmp_path / "t.gguf"
    p.write_bytes(b"old")

    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_gguf(
            p,
            "llama",
            {},
            [("a", Q.F32, (4,), np.zeros(4, np.float32)), ("b", Q.F32, (4,), boom)],
            progress=False,
        )
    assert p.read_bytes() == b"old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.gguf"]


@pytest.mark.parametrize(
    "entry, msg",
    [
        (("a", Q.Q8_0, (2, 64), np.zeros(100, np.uint8)), "needs 136"),
        (("a", Q.Q4_K, (2, 100), np.zeros(10, np.uint8)), "not a multiple"),
        (("a", Q.F32, (2, 4), np.zeros((2, 4), np.float64)), "dtype float64"),
        (("a", Q.Q8_0, (1, 32), np.zeros(34, np.int8)), "raw bytes"),
        (("a", 999, (1, 32), np.zeros(34, np.uint8)), "unknown GGML type"),
    ],
)
def test_bad_tensors_are_clear_errors(tmp_path, entry, msg):
    with pytest.raises(BadInput, match=msg):
        write_gguf(tmp_path / "t.gguf", "llama", {}, [entry], progress=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_metadata_and_names_are_clear_errors(tmp_path):
    t = ("a", Q.F32, (4,), np.zeros(4, np.float32))
    with pytest.raises(BadInput, match="given twice"):
        write_gguf(tmp_path / "t.gguf", "llama", {}, [t, t], progress=False)
    with pytest.raises(BadInput, match="contradicts"):
        write_gguf(
            tmp_path / "t.gguf", "llama", {"general.architecture": "qwen2"}, [t], progress=False
        )
    with pytest.raises(BadInput, match="empty arrays"):
        write_gguf(tmp_path / "t.gguf", "llama", {"k": []}, [t], progress=False)
    with pytest.raises(BadInput, match="mixed types"):
        write_gguf(tmp_path / "t.gguf", "llama", {"k": [1, "a"]}, [t], progress=False)
    with pytest.raises(BadInput, match="no such directory"):
        write_gguf(tmp_path / "nope" / "t.gguf", "llama", {}, [t], progress=False)
