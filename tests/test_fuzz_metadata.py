"""Property-based fuzzing of a small model's metadata values through `minfer prefill` (issue 24).

Hypothesis draws 1-3 edits of a valid 2-layer model (tests/synth_data.small_parts: F32, F16
and Q8_0 weights, a 260-token byte-level vocab): a hyperparameter or tokenizer key set to a
value of any GGUF type (absurd ints, NaN/inf/negative/tiny/huge floats, bools, strings,
arrays) or removed, a declared general.alignment that differs from the layout the file was
written with, or a NaN/inf/huge value written into a weight. Each case is written to disk and
run end to end through minfer.cli.main in this process (`prefill --backend cpu`), and must
end in exactly one of:
  exit 0 with finite logits (single.run's result, recorded), or
  exit 2 / 3 with stderr exactly one `error:` line.
Anything else (a traceback, another exit code, NaN decoded as success) fails the test.
MINFER_META_FUZZ_CASES sets the count (default 650); derandomized, so CI runs the same cases.
The counts by outcome go to the end-of-run summary ("minfer figures").
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_inproc import error_lines, run_cli  # noqa: E402
from synth_data import small_parts, write_small  # noqa: E402

N_CASES = int(os.environ.get("MINFER_META_FUZZ_CASES", "650"))

A = "llama"
KEYS = [
    f"{A}.{k}"
    for k in (
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.layer_norm_rms_epsilon",
        "rope.freq_base",
        "rope.dimension_count",
        "vocab_size",
    )
] + [
    "general.architecture",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
]

_INTS = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    15,
    16,
    17,
    31,
    32,
    33,
    63,
    64,
    65,
    127,
    128,
    256,
    259,
    260,
    261,
    512,
    4096,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**63,
    -1,
    -2,
    -(2**31),
]
_FLOATS = [
    math.nan,
    math.inf,
    -math.inf,
    0.0,
    -0.0,
    -1.0,
    1e-45,
    1e-38,
    1e-30,
    1e-12,
    1e-6,
    1e-5,
    0.5,
    1.0,
    10000.0,
    1e10,
    1e30,
    3.4e38,
]

values = st.one_of(
    st.sampled_from(_INTS),
    st.integers(-(2**40), 2**40),
    st.sampled_from(_FLOATS),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.booleans(),
    st.sampled_from(["", "2", "yes", "llama", "gpt2", "qwen2", "default", "\n", "\x1b[2J"]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=6),
    st.lists(st.integers(0, 300), min_size=1, max_size=3),
)
_DELETE = object()
meta_edit = st.tuples(st.just("meta"), st.sampled_from(KEYS), st.one_of(values, st.just(_DELETE)))
weight_edit = st.tuples(
    st.just("weight"),
    st.integers(0, 10_000),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e30, 6e4, 3.4e38]),
)
align_edit = st.tuples(
    st.just("align"), st.sampled_from([8, 16, 32, 64, 128]), st.sampled_from([8, 16, 32, 64, 128])
)
# metadata edits 8 times out of 10 (a weight or an alignment edit wins at the first check)
edit = st.integers(0, 9).flatmap(
    lambda i: meta_edit if i < 8 else weight_edit if i == 8 else align_edit
)
cases = st.lists(edit, min_size=1, max_size=3)


def _apply(parts, edits):
    meta, tensors = parts
    meta = dict(meta)
    tensors = list(tensors)
    align = None
    for kind, a, b in edits:
        if kind == "meta":
            if b is _DELETE:
                meta.pop(a, None)
            else:
                meta[a] = b
        elif kind == "weight":  # a value into a float tensor (F32/F16) chosen by a
            plain = [i for i, t in enumerate(tensors) if t[3].dtype != np.uint8]
            i = plain[a % len(plain)]
            n, q, shape, data = tensors[i]
            data = np.array(data, copy=True)
            with np.errstate(over="ignore"):
                data.reshape(-1)[a % data.size] = b
            tensors[i] = (n, q, shape, data)
        else:
            align = (a, b)
    if align:
        meta["general.alignment"] = align[0]
    return meta, tensors, align


def _patch_alignment(path: Path, declared: int) -> None:
    buf = bytearray(path.read_bytes())
    key = b"general.alignment"
    at = buf.index(key) + len(key) + 4
    buf[at : at + 4] = declared.to_bytes(4, "little")
    path.write_bytes(bytes(buf))


def test_fuzz_metadata_prefill(tmp_path, report, monkeypatch):
    from minfer.batch import single
    from minfer.errors import BadInput

    parts = small_parts(seed=5, tied=False)
    path = tmp_path / "case.gguf"
    outcomes: collections.Counter = collections.Counter()
    recorded = []
    real_run = single.run

    def recording_run(*a, **k):
        res = real_run(*a, **k)
        recorded.append(res.last_logits)
        return res

    monkeypatch.setattr(single, "run", recording_run)

    @settings(
        max_examples=N_CASES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def one(edits):
        meta, tensors, align = _apply(parts, edits)
        path.unlink(missing_ok=True)
        try:
            write_small(path, meta, tensors)
        except BadInput:  # a value the GGUF writer cannot represent: not a case
            outcomes["not writable"] += 1
            return
        if align and align[1] != align[0]:
            _patch_alignment(path, align[1])
        recorded.clear()
        code, out, err = run_cli(
            [
                "prefill",
                "-m",
                str(path),
                "--backend",
                "cpu",
                "-p",
                "hello world",
                "--greedy",
                "3",
                "--json",
            ]
        )
        lines = error_lines(err)
        if code == 0:
            assert not lines and "Traceback" not in err, (edits, err)
            assert len(recorded) == 1 and np.isfinite(recorded[0]).all(), edits
            assert len(json.loads(out)["greedy_ids"]) == 3
        else:
            assert code in (2, 3), (edits, code, err[-3000:])
            assert len(lines) == 1 and err.count("\n") == 1, (edits, err[-3000:])
        outcomes[f"exit {code}"] += 1

    t0 = time.perf_counter()
    one()
    wall = time.perf_counter() - t0
    ran = sum(v for k, v in outcomes.items() if k.startswith("exit"))
    report(
        f"fuzz-metadata: {ran} prefill cases run end to end "
        f"({outcomes['not writable']} drawn edits not writable as GGUF), outcomes "
        f"{dict(sorted((k, v) for k, v in outcomes.items() if k.startswith('exit')))}, "
        f"wall {wall:.1f} s"
    )
    assert ran >= min(N_CASES, 500) * 0.9, outcomes
    assert outcomes["exit 0"] and outcomes["exit 2"] and outcomes["exit 3"], outcomes
