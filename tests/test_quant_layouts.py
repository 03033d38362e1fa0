"""Block layouts: numpy dtypes (minfer/quants/layouts.py) == gguf's sizes == the static_asserts of
kernels/quant_blocks.cuh, and the header's asserts really hold under a C++ compiler."""

from __future__ import annotations

import re
import shutil
import subprocess

import gguf
import numpy as np
import pytest

from minfer.cuda.runtime.build import KERNEL_DIR
from minfer.quants import BY_NAME, SUPPORTED
from minfer.quants.layouts import BLOCK_DTYPES, Q8_1_RAW

HEADER = KERNEL_DIR / "quant_blocks.cuh"


def header_layouts() -> dict[str, dict]:
    """{"Q4_K": {"size": 144, "fields": {"d": 0, ...}}} from the header's static_asserts."""
    text = re.sub(r"//[^\n]*", "", HEADER.read_text())  # comments out
    out: dict[str, dict] = {}
    for m in re.finditer(r"static_assert\(sizeof\(block_(\w+)\)\s*==\s*(\d+)", text):
        out.setdefault(m.group(1).upper(), {"fields": {}})["size"] = int(m.group(2))
    for m in re.finditer(r"static_assert\(offsetof\(block_(\w+),\s*(\w+)\)\s*==\s*(\d+)", text):
        out.setdefault(m.group(1).upper(), {"fields": {}})["fields"][m.group(2)] = int(m.group(3))
    # every struct of the header is pinned: one sizeof assert and one per field
    structs = re.findall(r"struct block_(\w+)\s*\{([^}]*)\}", text)
    assert structs, "no block structs found in quant_blocks.cuh"
    for name, body in structs:
        fields = re.findall(r"(\w+)(?:\[\d+\])?;", body)
        got = out.get(name.upper())
        assert got and "size" in got, f"block_{name} has no sizeof static_assert"
        assert sorted(got["fields"]) == sorted(fields), (
            f"block_{name}: asserted fields {sorted(got['fields'])} != declared {sorted(fields)}"
        )
    return out


ALL_DTYPES = {**BLOCK_DTYPES, "Q8_1_RAW": Q8_1_RAW}


def test_every_quantized_type_has_a_layout():
    quant = [n for n in SUPPORTED if BY_NAME[n].block_size > 1]
    assert sorted(quant) == sorted(BLOCK_DTYPES)


@pytest.mark.parametrize("name", sorted(ALL_DTYPES))
def test_dtype_matches_header_and_gguf(name):
    dt = ALL_DTYPES[name]
    hdr = header_layouts()[name]
    assert dt.itemsize == hdr["size"]
    assert {f: dt.fields[f][1] for f in dt.names} == hdr["fields"]
    if name != "Q8_1_RAW":
        bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        assert dt.itemsize == ts
        assert BY_NAME[name].type_size == ts and BY_NAME[name].block_size == bs


def test_q8_1_raw_is_designs_layout():
    assert Q8_1_RAW.itemsize == 40
    assert (Q8_1_RAW.fields["d"][1], Q8_1_RAW.fields["qs"][1], Q8_1_RAW.fields["s"][1]) == (
        0,
        4,
        36,
    )


def test_dtype_fields_decode_like_gguf():
    """The dtypes' field meanings, on gguf-quantized data: q8_0 w = qs*d, q4_0 w = d*(nib-8)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    for name in ("Q8_0", "Q4_0"):
        qt = gguf.GGMLQuantizationType[name]
        raw = gguf.quants.quantize(w, qt)
        b = raw.reshape(-1).view(BLOCK_DTYPES[name])
        d = b["d"].astype(np.float32)[:, None]
        if name == "Q8_0":
            mine = b["qs"].astype(np.float32) * d
        else:
            nib = np.concatenate([b["qs"] & 15, b["qs"] >> 4], axis=1).astype(np.float32) - 8
            mine = d * nib
        assert mine.reshape(4, 64).tobytes() == gguf.quants.dequantize(raw, qt).tobytes()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_header_static_asserts_hold(tmp_path):
    """The header is plain C++: compiling it checks that the asserted numbers are true."""
    r = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-x", "c++", str(HEADER)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    # and a wrong number is caught (the check can fail)
    bad = tmp_path / "bad.cuh"
    bad.write_text(
        HEADER.read_text().replace("sizeof(block_q4_K) == 144", "sizeof(block_q4_K) == 146")
    )
    r = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-x", "c++", str(bad)],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
