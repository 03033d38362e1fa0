"""minfer.gguf.header: every structural violation is a one-line BadModel naming file, field, value.

Each test damages one field of a valid seed (tests/fuzz_corpus/make_corpus.py) at a position
found from the seed's own bytes, and checks the message; the real model must pass quickly.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

import pytest

from minfer.errors import BadModel
from minfer.gguf.header import read_header, scan_gguf

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> bytes:
    sys.path.insert(0, str(HERE / "fuzz_corpus"))
    try:
        import make_corpus
    finally:
        sys.path.pop(0)
    d = tmp_path_factory.mktemp("gguf_header")
    return make_corpus.write_seed(d / "s.gguf", "llama_mixed_align64").read_bytes()


def _bad(data: bytes, *needles: str) -> str:
    with pytest.raises(BadModel) as ei:
        scan_gguf(data, "f.gguf")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("f.gguf: "), msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def _put(data: bytes, pos: int, fmt: str, v) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, v)
    return bytes(b)


def _key_value_pos(data: bytes, key: str) -> int:
    """Position of the value type (u32) of metadata `key`."""
    k = key.encode()
    p = data.find(struct.pack("<Q", len(k)) + k)
    assert p > 0
    return p + 8 + len(k)


def _tensor_pos(data: bytes, name: str) -> dict[str, int]:
    n = name.encode()
    p = data.find(struct.pack("<Q", len(n)) + n)
    assert p > 0
    q = p + 8 + len(n)
    n_dims = struct.unpack_from("<I", data, q)[0]
    return {
        "n_dims": q,
        "dims": q + 4,
        "type": q + 4 + 8 * n_dims,
        "offset": q + 8 + 8 * n_dims,
        "n": n_dims,
    }


def test_seed_valid(seed):
    lay = scan_gguf(seed, "s", record=True)
    assert lay.version == 3 and lay.alignment == 64 and lay.n_tensors == len(lay.tensors)
    assert lay.data_start % 64 == 0 and lay.fields


def test_header(seed):
    _bad(b"GGU", "truncated", "3 bytes")
    _bad(b"GGML" + seed[4:], "not a GGUF file")
    _bad(_put(seed, 4, "<I", 1), "unsupported GGUF version 1")
    _bad(_put(seed, 4, "<I", 4), "version 4")
    _bad(_put(seed, 4, "<I", 3 << 24), "big-endian")
    t0 = time.perf_counter()
    _bad(_put(seed, 8, "<Q", 1 << 63), f"tensor count {1 << 63}", "impossible")
    _bad(_put(seed, 16, "<Q", (1 << 64) - 1), "kv count", "impossible")
    _bad(_put(seed, 8, "<Q", len(seed) // 32 + 1), "tensor count", "impossible")
    assert time.perf_counter() - t0 < 1  # refused from the counts alone, nothing allocated


def test_every_truncation_refused(seed):
    lay = scan_gguf(seed, "s")
    for cut in list(range(0, lay.data_start + 1, 7)) + [len(seed) - 1]:
        with pytest.raises(BadModel):
            scan_gguf(seed[:cut], "f.gguf")


def test_kv_fields(seed):
    p = _key_value_pos(seed, "general.architecture")
    _bad(_put(seed, p - 8 - len("general.architecture"), "<Q", 1 << 40), "kv[", "key length")
    _bad(_put(seed, p, "<I", 13), "general.architecture", "unknown value type id 13")
    _bad(_put(seed, p + 4, "<Q", 1 << 50), "'general.architecture' length", str(1 << 50))
    t = _key_value_pos(seed, "tokenizer.ggml.tokens")  # array: elem type, count, strings
    _bad(_put(seed, t + 4, "<I", 77), "tokenizer.ggml.tokens", "element type id 77")
    _bad(_put(seed, t + 8, "<Q", 1 << 61), "tokenizer.ggml.tokens", "array count")
    _bad(_put(seed, t + 16, "<Q", 1 << 33), "tokenizer.ggml.tokens'[0] length")
    tt = _key_value_pos(seed, "tokenizer.ggml.token_type")  # int32 array
    _bad(_put(seed, tt + 8, "<Q", 10**9), "token_type", "array count 1000000000")
    # a key that is not UTF-8, and a duplicate key
    k = b"general.architecture"
    kp = seed.find(k)
    _bad(seed[:kp] + b"\xffeneral.architecture" + seed[kp + len(k) :], "not UTF-8")
    e = b"tokenizer.ggml.eos_token_id"
    d = seed.find(e)
    _bad(
        seed[:d] + b"tokenizer.ggml.bos_token_id" + seed[d + len(e) :],
        "duplicate metadata key 'tokenizer.ggml.bos_token_id'",
    )


def test_string_values_must_be_utf8(seed):
    d = b"minfer fuzz seed"  # general.description's value
    i = seed.find(d)
    _bad(seed[:i] + b"\xff" + seed[i + 1 :], "'general.description'", "not UTF-8")
    t = _key_value_pos(seed, "tokenizer.ggml.tokens")  # type, elem type, count, [len, bytes]
    n = struct.unpack_from("<Q", seed, t + 16)[0]
    j = t + 24 + n + 8  # the bytes of token 1
    _bad(seed[:j] + b"\xc3" + seed[j + 1 :], "'tokenizer.ggml.tokens'[1] is not UTF-8")


def test_values_parsed_with_types(seed):
    import gguf

    V = gguf.GGUFValueType
    kv = scan_gguf(seed, "s").kv
    assert kv["general.alignment"] == gguf.GGUFValue(64, V.UINT32)
    assert kv["general.description"].value == "minfer fuzz seed ünïcödé"
    tok = kv["tokenizer.ggml.tokens"]
    assert (tok.type, tok.sub_type, len(tok.value), tok.value[0]) == (
        V.ARRAY,
        V.STRING,
        24,
        "<|endoftext|>",
    )
    assert kv["tokenizer.ggml.token_type"].value == [3] + [1] * 23
    assert kv["tokenizer.ggml.add_bos_token"] == gguf.GGUFValue(False, V.BOOL)


def test_alignment(seed):
    p = _key_value_pos(seed, "general.alignment")
    _bad(_put(seed, p + 4, "<I", 0), "general.alignment = 0", "power of two")
    _bad(_put(seed, p + 4, "<I", 48), "general.alignment = 48")
    _bad(_put(seed, p, "<I", 5), "general.alignment has type int32")
    # alignment 32 declared on a file laid out for 64: the tensors would be read shifted
    # (garbage that decoded as greedy [0, 0, ...]); llama.cpp's layout rule refuses it
    _bad(_put(seed, p + 4, "<I", 32), "general.alignment 32", "expected")
    _bad(_put(seed, p + 4, "<I", 128), "alignment 128")


def test_tensor_infos(seed):
    t = _tensor_pos(seed, "blk.0.attn_q.weight")  # Q4_0 [64 rows, 64 cols]
    assert t["n"] == 2
    _bad(_put(seed, t["n_dims"], "<I", 0), "'blk.0.attn_q.weight' n_dims = 0")
    _bad(_put(seed, t["n_dims"], "<I", 5), "n_dims = 5")
    _bad(_put(seed, t["dims"], "<Q", 0), "'blk.0.attn_q.weight' dim 0 = 0")
    big = _put(_put(seed, t["dims"], "<Q", 1 << 40), t["dims"] + 8, "<Q", 1 << 40)
    _bad(big, "blk.0.attn_q.weight", "too many elements")
    _bad(_put(seed, t["type"], "<I", 99), "unknown ggml type id 99")
    _bad(_put(seed, t["type"], "<I", 4), "unknown ggml type id 4")  # removed Q4_2
    _bad(_put(seed, t["dims"], "<Q", 48), "row length 48", "block size 32")
    off = struct.unpack_from("<Q", seed, t["offset"])[0]
    _bad(_put(seed, t["offset"], "<Q", off + 32), "offset", "alignment 64")
    _bad(_put(seed, t["offset"], "<Q", 1 << 62), "blk.0.attn_q.weight", "outside")
    _bad(_put(seed, t["dims"] + 8, "<Q", 64 * 1000), "outside the")  # rows past the end
    # two tensors on the same bytes
    u = _tensor_pos(seed, "blk.0.attn_k.weight")
    other = struct.unpack_from("<Q", seed, u["offset"])[0]
    _bad(_put(seed, t["offset"], "<Q", other), "overlap")
    # a duplicate tensor name
    a, b = b"blk.0.attn_q.weight", b"blk.0.attn_k.weight"
    i = seed.find(a)
    _bad(seed[:i] + b + seed[i + len(a) :], "duplicate tensor name 'blk.0.attn_k.weight'")
    _bad(seed[:i] + b"\xc3" + seed[i + 1 :], "not UTF-8")


def test_file_errors(tmp_path):
    with pytest.raises(BadModel, match="no such file"):
        read_header(tmp_path / "nope.gguf")
    (tmp_path / "e.gguf").write_bytes(b"")
    with pytest.raises(BadModel, match="truncated GGUF"):
        read_header(tmp_path / "e.gguf")


def test_real_model_fast(default_model_path):
    read_header(default_model_path)  # warm (imports, page cache)
    t0 = time.perf_counter()
    lay = read_header(default_model_path)
    dt = time.perf_counter() - t0
    print(
        f"\nread_header (validate + parse) on the 98 MB model (49k vocab + merges): {dt * 1e3:.0f} ms"
    )
    assert lay.n_tensors == 272 and lay.alignment == 32
    assert dt < 5  # a guard against an accidental quadratic scan, not a benchmark
