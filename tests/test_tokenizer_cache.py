"""A SentencePiece vocabulary's merge list (derived from its tokens and scores in Python: ~1.5 s
for Gemma 3's 262k tokens) is kept in MINFER_CACHE keyed by the vocabulary's hash: a second
build reads it, encodes the same, and a damaged cache file is rebuilt, not trusted."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from minfer.text import tokenizer as T


def spm_meta(n: int, seed: int = 0) -> dict:
    """An SPM vocabulary of n tokens: controls, 256 byte tokens, characters, then pieces grown
    by joining two existing ones (each has a split, as in a vocabulary built by merges)."""
    rng = random.Random(seed)
    chars = [chr(c) for c in list(range(0x21, 0x7F)) + list(range(0x4E00, 0x4E80))]
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += ["▁"] + chars
    seen, pool = set(toks), ["▁"] + chars
    while len(toks) < n:
        t = pool[min(int(rng.expovariate(1 / 300)), len(pool) - 1)] + rng.choice(pool[:400])
        if t not in seen and len(t) <= 16:
            seen.add(t)
            toks.append(t)
            pool.append(t)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": [0.0] * 260 + [-float(i) for i in range(n - 260)],
        "tokenizer.ggml.token_type": [3, 3, 3, 2] + [6] * 256 + [1] * (n - 260),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
    }


TEXT = "▁ab 漢字 hello, world: the merges of a cached vocabulary \x01"


def test_spm_merges_cached_by_vocab_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(T, "SPM_CACHE_MIN_VOCAB", 1000)
    meta = spm_meta(5000)
    want = T.Tokenizer(meta).encode(TEXT)
    files = list((tmp_path / "tokenizer").glob("spm-*.npy"))
    assert len(files) == 1
    ids = np.load(files[0])
    assert ids.dtype == np.int32 and ids.shape[1] == 2 and len(ids) >= 5000 - 260 - 200
    calls = []
    monkeypatch.setattr(T, "_write_merge_ids", lambda *a: calls.append(a))
    assert T.Tokenizer(meta).encode(TEXT) == want and calls == []  # read, not rebuilt
    other = dict(meta, **{"tokenizer.ggml.scores": list(reversed(meta["tokenizer.ggml.scores"]))})
    T.Tokenizer(other)
    assert len(calls) == 1  # other scores: another key, built
    files[0].write_bytes(b"not a numpy file")
    assert T.Tokenizer(meta).encode(TEXT) == want and len(calls) == 2  # damaged: rebuilt
    np.save(files[0], np.full((3, 2), 10**6, np.int32))  # ids beyond the vocab
    assert T.Tokenizer(meta).encode(TEXT) == want and len(calls) == 3


def test_small_vocab_writes_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    T.Tokenizer(spm_meta(2000))
    assert not (tmp_path / "tokenizer").exists()


def test_unwritable_cache_still_builds(tmp_path, monkeypatch):
    ro = tmp_path / "file"
    ro.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MINFER_CACHE", str(ro))
    monkeypatch.setattr(T, "SPM_CACHE_MIN_VOCAB", 1000)
    meta = spm_meta(3000)
    assert T.Tokenizer(meta).encode(TEXT)


@pytest.mark.slow
def test_gemma3_size_vocab_is_read_from_the_cache(tmp_path, monkeypatch):
    """262,144 tokens (Gemma 3's): the second build reads the cached merges, not derives them
    (their times are printed, not asserted: speed lives in benchmarks)."""
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    meta = spm_meta(262144)
    t0 = time.perf_counter()
    first = T.Tokenizer(meta)
    cold = time.perf_counter() - t0
    calls = []
    monkeypatch.setattr(T, "_write_merge_ids", lambda *a: calls.append(a))
    t0 = time.perf_counter()
    again = T.Tokenizer(meta)
    warm = time.perf_counter() - t0
    assert again.encode(TEXT) == first.encode(TEXT) and calls == []
    print(f"262k SPM tokenizer: built {cold:.2f} s, from the cache {warm:.2f} s")
