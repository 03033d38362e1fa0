"""minfer.gguf.loader (on minfer.gguf.header) against the reference, gguf.GGUFReader.

On the default model, the fuzz seeds, tiny synthetic models and odd hand-made files, the loader's
metadata must equal what the reference's `field.contents()` gives (same keys, order, values and
Python types) and every tensor the reference's type, shape, dtype and bytes; tensor data are
read-only views into one memory map of the file, and the reference reader is never opened.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from minfer.gguf.header import open_gguf, tensor_view
from minfer.gguf.loader import load_model
from minfer.gguf.write import metadata_from_reader

HERE = Path(__file__).resolve().parent
Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType


def _same_value(a, b) -> bool:
    """Equal and of the same Python types (True == 1 would hide a bool read as an int)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _assert_faithful(ref, metadata: dict, tensors: dict, data_map: np.ndarray) -> None:
    """metadata {key: value}, tensors {name: (qtype, shape, data)} vs gguf.GGUFReader `ref`."""
    want = {k: f.contents() for k, f in ref.fields.items()}
    assert list(metadata) == list(want)
    for k, v in want.items():
        assert _same_value(metadata[k], v), (k, str(metadata[k])[:200], str(v)[:200])
    assert [t.name for t in ref.tensors] == list(tensors)
    lo = data_map.__array_interface__["data"][0]
    hi = lo + data_map.nbytes
    for t in ref.tensors:
        qtype, shape, data = tensors[t.name]
        assert qtype == int(t.tensor_type), t.name
        assert shape == tuple(int(x) for x in reversed(t.shape)), t.name
        assert (data.dtype, data.shape) == (t.data.dtype, t.data.shape), t.name
        assert not data.flags.writeable, t.name
        assert data.flags.c_contiguous, t.name
        a = data.__array_interface__["data"][0]  # a view into the one map, at the reference's
        assert lo <= a and a + data.nbytes <= hi and a - lo == t.data_offset, t.name  # offset
        assert np.array_equal(data.view(np.uint8), t.data.view(np.uint8)), t.name


def _check_model(path):
    m = load_model(path)
    assert "reader" not in m.__dict__  # the slow reference reader was not opened to load
    _assert_faithful(
        m.reader,
        m.metadata,  # (m.reader: gguf.GGUFReader, opened now)
        {n: (t.qtype, t.shape, t.data) for n, t in m.tensors.items()},
        m._map,
    )
    return m


def test_default_model_is_faithful_to_gguf_reader(default_model_path):
    m = _check_model(default_model_path)
    # dequantization (the gguf package's) sees the same bytes as through the reference
    ref = {t.name: t for t in m.reader.tensors}
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight"):
        t = ref[name]
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.array_equal(m.dequant(name), want.reshape(m.tensor(name).shape)), name
    # the typed metadata writers copy: the same as through the reference's fields
    fast, slow = metadata_from_reader(m), metadata_from_reader(m.reader)
    assert list(fast) == list(slow)
    for k in slow:
        assert (fast[k].type, fast[k].sub_type) == (slow[k].type, slow[k].sub_type), k
        assert _same_value(fast[k].value, slow[k].value), k


def test_fuzz_seeds_are_faithful(tmp_path):
    sys.path.insert(0, str(HERE / "fuzz_corpus"))
    try:
        from make_corpus import make_corpus
    finally:
        sys.path.pop(0)
    seeds = make_corpus(tmp_path)
    for p in seeds:
        _check_model(p)
    # nested arrays come back flattened like ReaderField.contents(); writers refuse them
    m = load_model(next(p for p in seeds if "spm" in p.name))
    assert m.metadata["fuzz.nested"] == [1, 2, 3]
    assert m.header.kv["fuzz.nested"].sub_type == V.ARRAY


@pytest.mark.parametrize("qtype", ["q4_K_M", "f16"])
def test_synthetic_models_are_faithful(tmp_path, qtype):
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    p = tmp_path / f"tiny-{qtype}.gguf"
    make_synthetic_model(
        p,
        SynthOptions(preset="tiny", qtype=qtype, seed=1, vocab=300, tokenizer_from=None, workers=1),
        progress=False,
    )
    _check_model(p)


def test_odd_files_are_faithful(tmp_path):
    """Types a llama model does not hold: BF16, F64, I8/I32, 3-D, 1-D quantized; every value
    type, nested arrays; and a hand-made file with an empty array and a bool byte of 2."""
    rng = np.random.default_rng(0)
    p = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    for i, (vt, v) in enumerate(
        [
            (V.UINT8, 200),
            (V.INT8, -3),
            (V.UINT16, 65535),
            (V.INT16, -32768),
            (V.UINT32, 2**32 - 1),
            (V.INT32, -7),
            (V.FLOAT32, 0.1),
            (V.BOOL, True),
            (V.STRING, "héllo"),
            (V.UINT64, 2**64 - 1),
            (V.INT64, -(2**63)),
            (V.FLOAT64, 0.1),
        ]
    ):
        w.add_key_value(f"x.scalar{i}", v, vt)
    w.add_array("x.nested", [[1, 2], [3]])
    w.add_array("x.nested_str", [["a", "bc"], ["d"]])
    w.add_key_value("x.f32s", [0.1, -2.5], V.ARRAY, V.FLOAT32)
    w.add_key_value("x.bools", [True, False], V.ARRAY, V.BOOL)
    w.add_key_value("x.u64s", [2**64 - 1, 0], V.ARRAY, V.UINT64)
    w.add_tensor("t.bf16", rng.integers(0, 256, (3, 64), dtype=np.uint8), raw_dtype=Q.BF16)
    w.add_tensor("t.f64", rng.standard_normal((2, 5)))
    w.add_tensor("t.i8", rng.integers(-128, 128, (4,), dtype=np.int8))
    w.add_tensor("t.i32", rng.integers(-9, 9, (2, 3), dtype=np.int32))
    w.add_tensor("t.3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    w.add_tensor("t.q8_1d", rng.integers(0, 256, (2 * 34,), dtype=np.uint8), raw_dtype=Q.Q8_0)
    w.add_tensor("t.q4k_3d", rng.integers(0, 256, (2, 3, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    def kv(key: str, vtype: int, payload: bytes) -> bytes:
        k = key.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + payload

    hand = tmp_path / "hand.gguf"  # (gguf's writer drops empty arrays: made by hand)
    hand.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 3)
        + kv("x.empty", 9, struct.pack("<IQ", 0, 0))
        + kv("x.bool2", 7, b"\x02")
        + kv("x.bools2", 9, struct.pack("<IQ", 7, 3) + b"\x00\x02\x01")
    )
    for path in (p, hand):
        h, data = open_gguf(path)
        meta = {
            "GGUF.version": h.version,
            "GGUF.tensor_count": h.n_tensors,
            "GGUF.kv_count": h.n_kv,
        } | {k: v.value for k, v in h.kv.items()}
        _assert_faithful(
            gguf.GGUFReader(str(path), "r"),
            meta,
            {t.name: (t.qtype, t.shape, tensor_view(data, t)) for t in h.tensors},
            data,
        )
    assert open_gguf(hand)[0].kv["x.empty"] == gguf.GGUFValue([], V.ARRAY, V.UINT8)


def test_nested_arrays_are_not_written_back(tmp_path):
    from minfer.errors import BadInput
    from minfer.gguf.write import write_gguf

    sys.path.insert(0, str(HERE / "fuzz_corpus"))
    try:
        from make_corpus import write_seed
    finally:
        sys.path.pop(0)
    m = load_model(write_seed(tmp_path / "s.gguf", "llama_spm_vocab"))
    with pytest.raises(BadInput, match="'fuzz.nested': nested arrays are not supported"):
        write_gguf(tmp_path / "o.gguf", "llama", metadata_from_reader(m), [], progress=False)


def test_mutated_files_we_accept_read_as_the_reference_reads_them(tmp_path):
    """The fuzzer's mutations (tests/test_fuzz_gguf.py): every file the parser accepts must
    read exactly as gguf.GGUFReader reads it (values compared by repr: types included)."""
    import os
    import random

    from minfer.errors import BadModel

    sys.path.insert(0, str(HERE / "fuzz_corpus"))
    sys.path.insert(0, str(HERE))
    try:
        from make_corpus import make_corpus
        from test_fuzz_gguf import mutate
    finally:
        del sys.path[:2]
    from minfer.gguf.header import scan_gguf

    seeds = make_corpus(tmp_path / "seeds")
    datas = [p.read_bytes() for p in seeds]
    layouts = [scan_gguf(d, "seed", record=True) for d in datas]
    rng = random.Random(7)
    path, staging = tmp_path / "case.gguf", tmp_path / "case.tmp"
    accepted = 0
    for _ in range(1500):
        i = rng.randrange(len(datas))
        data, what = mutate(datas[i], layouts[i], datas[rng.randrange(len(datas))], rng)
        staging.write_bytes(data)
        os.replace(staging, path)  # a fresh inode: no old map sees the new bytes
        try:
            h, mm = open_gguf(path)
        except BadModel:
            continue  # (the reference reader is not safe on what we refuse: not run)
        accepted += 1
        ref = gguf.GGUFReader(str(path), "r")
        want = {k: repr(f.contents()) for k, f in ref.fields.items()}
        got = {
            "GGUF.version": h.version,
            "GGUF.tensor_count": h.n_tensors,
            "GGUF.kv_count": h.n_kv,
        } | {k: v.value for k, v in h.kv.items()}
        assert {k: repr(v) for k, v in got.items()} == want, what
        assert [t.name for t in h.tensors] == [t.name for t in ref.tensors], what
        for t, r in zip(h.tensors, ref.tensors):
            v = tensor_view(mm, t)
            assert (t.qtype, v.dtype, v.shape) == (
                int(r.tensor_type),
                r.data.dtype,
                r.data.shape,
            ), what
            assert v.tobytes() == r.data.tobytes(), what
        del h, mm, ref
    assert accepted > 50  # the comparison ran on a real sample
