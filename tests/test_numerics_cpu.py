"""Non-finite numbers and bad hyperparameters end in one `error:` line, never in decoded NaN.

Each case was an exit 0 printing `greedy [0, 0, 0, 0]` (argmax over NaN), a traceback, or a
silent wrong run (issue 24). Non-finite values: exit 3 naming the first layer whose output
went non-finite; hyperparameters: exit 2 naming the GGUF key.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_inproc import error_lines, run_cli  # noqa: E402
from synth_data import small_parts, write_small  # noqa: E402


@pytest.fixture(scope="module")
def parts():
    return small_parts(seed=3, tied=False)


def _prefill(path: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(
        [
            "prefill",
            "-m",
            str(path),
            "--backend",
            "cpu",
            "-p",
            "hello world",
            "--greedy",
            "4",
            *extra,
        ]
    )


def _one_error(code: int, err: str, want_code: int, *needles: str) -> str:
    lines = error_lines(err)
    assert code == want_code, err
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _with_tensor(parts, name: str, edit) -> tuple[dict, list]:
    meta, tensors = parts
    out = []
    for n, q, shape, data in tensors:
        if n == name:
            data = np.array(data, copy=True)
            edit(data)
        out.append((n, q, shape, data))
    return meta, out


def test_small_model_runs(parts, tmp_path):
    code, out, err = _prefill(write_small(tmp_path / "m.gguf", *parts))
    assert code == 0, err
    assert "greedy" in out


# -- non-finite values in weights: exit 3 naming the layer -----------------------------------------
def _nan_f16_scale(a):  # Q8_0 block: f16 scale d at bytes 0..1, then 32 int8
    a[0, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)


@pytest.mark.parametrize(
    "name, edit, where",
    [
        ("blk.1.ffn_down.weight", _nan_f16_scale, "layer 1 (blk.1)"),  # Q8_0 scale NaN
        ("blk.0.attn_q.weight", _nan_f16_scale, "layer 0 (blk.0)"),
        ("blk.0.attn_k.weight", lambda a: a.__setitem__((3, 5), np.inf), "layer 0 (blk.0)"),  # F16
        ("blk.1.ffn_norm.weight", lambda a: a.__setitem__(slice(None), 1e30), "layer 1 (blk.1)"),
        ("blk.0.attn_norm.weight", lambda a: a.__setitem__(7, np.nan), "layer 0 (blk.0)"),  # F32
        ("output_norm.weight", lambda a: a.__setitem__(0, np.nan), "the output layer"),
        ("output.weight", lambda a: a.__setitem__(slice(None), 3e38), "the output layer"),
        ("token_embd.weight", lambda a: a.__setitem__(slice(None), np.inf), "the embedding"),
    ],
)
def test_non_finite_weight_is_exit_3_naming_the_layer(parts, tmp_path, name, edit, where):
    p = write_small(tmp_path / "m.gguf", *_with_tensor(parts, name, edit))
    code, out, err = _prefill(p)
    _one_error(code, err, 3, "non-finite", where, "position", "token id")
    assert "greedy" not in out


def test_first_bad_position_named(parts, tmp_path):
    # a NaN in the embedding row of one token: the first position holding that token is named
    meta, tensors = _with_tensor(
        parts, "token_embd.weight", lambda a: a.__setitem__((ord("w"), 0), np.nan)
    )
    p = write_small(tmp_path / "m.gguf", meta, tensors)
    code, _, err = _prefill(p)  # "hello world": 'w' at position 6 (no BOS)
    _one_error(code, err, 3, "embedding", "position 6", f"token id {ord('w')}")


class _NaNBackend:
    """Finite logits for the prompt, NaN from the decode step `bad_step` on."""

    name = "fake"

    def __init__(self, bad_step: int | None):
        self.bad_step, self.calls = bad_step, 0

    def reset(self):
        self.calls = 0

    def synchronize(self):
        pass

    def forward(self, ids, pos0):
        self.calls += 1
        out = np.arange(8, dtype=np.float32)
        if self.bad_step is not None and self.calls > self.bad_step:
            out[2] = np.nan
        return out


@pytest.mark.parametrize("bad_step, what", [(0, "prefill"), (2, "decode step 2")])
def test_engine_refuses_non_finite_logits_of_any_backend(bad_step, what):
    from minfer.batch import single
    from minfer.errors import NumericError

    with pytest.raises(NumericError, match=what) as e:
        single.run(_NaNBackend(bad_step), [1, 2, 3], n_greedy=4, n_ctx=64)
    assert e.value.exit_code == 3
    assert "fake" in str(e.value)
    single.run(_NaNBackend(None), [1, 2, 3], n_greedy=4, n_ctx=64)  # finite: runs


# -- hyperparameters: type, range, consistency; exit 2 naming the key -----------------------------
@pytest.mark.parametrize(
    "key, value, needles",
    [
        ("llama.block_count", True, ["'llama.block_count'", "must be an integer", "bool"]),
        ("llama.block_count", "2", ["'llama.block_count'", "string"]),
        ("llama.block_count", 2.5, ["'llama.block_count'", "float"]),
        ("llama.block_count", 1, ["'blk.1.", "'llama.block_count' = 1"]),  # layer 1 unused
        ("llama.block_count", 3, ["llama.block_count = 3", "only 21 tensors"]),
        ("llama.rope.dimension_count", 0, ["'llama.rope.dimension_count' = 0", "out of range"]),
        ("llama.rope.dimension_count", 17, ["'llama.rope.dimension_count' = 17", "out of range"]),
        ("llama.rope.dimension_count", 15, ["'llama.rope.dimension_count' = 15", "even"]),
        ("llama.attention.layer_norm_rms_epsilon", math.nan, ["layer_norm_rms_epsilon", "finite"]),
        ("llama.attention.layer_norm_rms_epsilon", -1.0, ["layer_norm_rms_epsilon", "> 0"]),
        ("llama.attention.layer_norm_rms_epsilon", 0.0, ["layer_norm_rms_epsilon"]),
        ("llama.rope.freq_base", 0.0, ["'llama.rope.freq_base'", "> 0"]),
        ("llama.rope.freq_base", math.inf, ["'llama.rope.freq_base'", "finite"]),
        ("llama.rope.freq_base", -10000.0, ["'llama.rope.freq_base'"]),
        ("llama.attention.head_count_kv", 3, ["'llama.attention.head_count_kv' = 3", "divide"]),
        ("llama.attention.head_count_kv", 0, ["'llama.attention.head_count_kv' = 0"]),
        ("llama.attention.key_length", 32, ["attn_q.weight", "head_count x head_dim = 128"]),
        ("llama.attention.head_count", 8, ["'llama.rope.dimension_count' = 16", "[1, 8]"]),
        ("llama.embedding_length", 128, ["token_embd.weight", "llama.embedding_length = 128"]),
        ("llama.feed_forward_length", 96, ["ffn_gate.weight", "llama.feed_forward_length = 96"]),
        ("llama.vocab_size", 300, ["token_embd.weight", "llama.vocab_size = 300"]),
        ("llama.context_length", 0, ["'llama.context_length' = 0"]),
        ("llama.attention.value_length", 32, ["'llama.attention.value_length'"]),
        ("tokenizer.ggml.add_bos_token", "yes", ["'tokenizer.ggml.add_bos_token'", "bool"]),
        ("tokenizer.ggml.bos_token_id", 2.0, ["'tokenizer.ggml.bos_token_id'", "integer"]),
    ],
)
def test_bad_hyperparameter_is_exit_2_naming_the_key(parts, tmp_path, key, value, needles):
    meta, tensors = parts
    p = write_small(tmp_path / "m.gguf", {**meta, key: value}, tensors)
    code, out, err = _prefill(p)
    _one_error(code, err, 2, *needles)


def test_duplicate_token_named(parts, tmp_path):
    meta, tensors = parts
    toks = list(meta["tokenizer.ggml.tokens"])
    toks[300 - 42] = toks[10]  # a pair token replaced by a byte token's text: '+' (byte 10)
    p = write_small(tmp_path / "m.gguf", {**meta, "tokenizer.ggml.tokens": toks}, tensors)
    code, _, err = _prefill(p)
    line = _one_error(code, err, 2, "appears twice", "ids 10 and 258")
    assert ascii(toks[10]) in line


def test_wrong_alignment_refused(parts, tmp_path):
    # written with alignment 64, then the key rewritten to 32 in place (same bytes elsewhere)
    meta, tensors = parts
    p = write_small(tmp_path / "m.gguf", {**meta, "general.alignment": 64}, tensors)
    from minfer.gguf.header import read_header

    assert read_header(p).alignment == 64
    buf = bytearray(p.read_bytes())
    key = b"general.alignment"
    at = buf.index(key) + len(key) + 4  # past the key and its value type
    assert int.from_bytes(buf[at : at + 4], "little") == 64
    buf[at : at + 4] = (32).to_bytes(4, "little")
    p.write_bytes(bytes(buf))
    code, _, err = _prefill(p)
    _one_error(code, err, 2, "general.alignment 32")
