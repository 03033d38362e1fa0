"""llama.cpp's answers on minfer's tiny synthetic family files -> tests/golden/families/.

For each preset of FAMILIES: write the tiny F16 synthetic model (`minfer synth`, a generated
byte-level vocab of 1024), run llama.cpp on PROMPT through scripts/llama_oracle.cpp (libllama,
CPU), and keep what the tests compare against: llama.cpp's prompt ids, 32 greedy ids with
their margins, and its logits at POSITIONS of the prompt (float32). The synthetic file is
deterministic, so CI rebuilds it and needs no llama.cpp.

    python3 scripts/llama_oracle.py --llama /tmp/llama.cpp [--presets tiny-llama3,...]
    (a preset's golden runs at llama.cpp's context ORACLE_CTX, else prompt + 40; the CTX_GOLDEN
    runs of the preset too, at theirs: tiny-phi3-long and tiny-phi3-long@512)
    python3 scripts/llama_oracle.py --llama /tmp/llama.cpp --gemma3 models/gemma-3-270m-q4_k_m.gguf

--llama: a llama.cpp tree built for the CPU with the `llama` target (../shared/llamacpp/
README.md; `cmake --build build --target llama`).
--gemma3: the real Gemma 3 270M Q4_K_M (scripts/fetch_gemma3.py) instead of the presets: for
each of REAL_PROMPTS, llama.cpp's prompt ids, 32 greedy ids and margins, and its top-20 logits
at the last prompt position (ids and values; not the full 262144-wide rows) go to
tests/golden/gemma3-270m/ (tests/test_gemma3_real.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from families_data import (
    CTX_GOLDEN,
    FAMILIES,
    GOLDEN,
    ORACLE_CTX,
    PROMPT,  # noqa: E402
    SPECIAL_PROMPT,
    positions,
    synth_family,
)


def build(llama: Path, out: Path) -> Path:
    exe = out / "llama_oracle"
    lib = llama / "build" / "bin"
    subprocess.run(
        [
            "g++",
            "-O2",
            "-std=c++17",
            str(ROOT / "scripts" / "llama_oracle.cpp"),
            f"-I{llama / 'include'}",
            f"-I{llama / 'ggml' / 'include'}",
            f"-L{lib}",
            "-lllama",
            "-lggml",
            "-lggml-base",
            f"-Wl,-rpath,{lib}",
            "-o",
            str(exe),
        ],
        check=True,
    )
    return exe


GEMMA3_GOLDEN = ROOT / "tests" / "golden" / "gemma3-270m"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# name -> text: plain text, and Gemma's chat turn markup (special tokens parsed)
REAL_PROMPTS = {
    "france": "The capital of France is",
    "chat": "<start_of_turn>user\nWhat is 2+2? Answer in one sentence.<end_of_turn>\n"
    "<start_of_turn>model\n",
}
TOP = 20


def real_gemma3(exe: Path, model: Path, tmp: Path) -> None:
    import hashlib

    h = hashlib.sha256()
    with open(model, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != GEMMA3_SHA256:
        sys.exit(f"{model}: sha256 {h.hexdigest()} is not Gemma 3 270M Q4_K_M's")
    GEMMA3_GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, text in REAL_PROMPTS.items():
        (tmp / f"{name}.txt").write_text(text)
        subprocess.run(
            [str(exe), str(model), str(tmp / f"{name}.txt"), str(tmp / name)],
            check=True,
            stderr=subprocess.DEVNULL,
        )
        res = json.loads((tmp / f"{name}.json").read_text())
        V, T = res["n_vocab"], len(res["ids"])
        last = np.fromfile(tmp / f"{name}.f32", dtype=np.float32).reshape(T, V)[-1]
        top = np.argsort(-last, kind="stable")[:TOP]
        res |= {
            "prompt": text,
            "model": model.name,
            "sha256": GEMMA3_SHA256,
            "top_ids": [int(i) for i in top],
            "top_logits": [float(last[i]) for i in top],
            "source": "llama.cpp (llama-cpp-python 0.3.36's vendored tree), CPU, "
            "scripts/llama_oracle.cpp",
        }
        (GEMMA3_GOLDEN / f"{name}.json").write_text(json.dumps(res) + "\n")
        print(f"gemma3 {name}: {T} prompt tokens, greedy {res['greedy'][:8]}...")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama", type=Path, required=True, help="a llama.cpp CPU build tree")
    ap.add_argument(
        "--presets", default=",".join(FAMILIES), help="presets of FAMILIES (or names of CTX_GOLDEN)"
    )
    ap.add_argument("--gemma3", type=Path, help="the real Gemma 3 270M Q4_K_M file instead")
    a = ap.parse_args()
    if a.gemma3 is not None:
        with tempfile.TemporaryDirectory() as td:
            real_gemma3(build(a.llama, Path(td)), a.gemma3, Path(td))
        return
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        exe = build(a.llama, tmp)
        (tmp / "prompt.txt").write_text(PROMPT)
        (tmp / "special.txt").write_text(SPECIAL_PROMPT)
        runs = []  # (golden name, preset, llama.cpp's n_ctx or None: prompt + 40)
        for name in a.presets.split(","):
            if name in CTX_GOLDEN:
                runs.append((name, *CTX_GOLDEN[name]))
                continue
            runs.append((name, name, ORACLE_CTX.get(name)))
            runs += [(g, p, c) for g, (p, c) in CTX_GOLDEN.items() if p == name]
        for name, preset, n_ctx in runs:
            model = synth_family(preset, tmp)
            ctx = [] if n_ctx is None else ["32", str(n_ctx)]
            subprocess.run(
                [str(exe), str(model), str(tmp / "prompt.txt"), str(tmp / preset)] + ctx,
                check=True,
                stderr=subprocess.DEVNULL,
            )
            res = json.loads((tmp / f"{preset}.json").read_text())
            subprocess.run(
                [str(exe), str(model), str(tmp / "special.txt"), str(tmp / "sp"), "1"],
                check=True,
                stderr=subprocess.DEVNULL,
            )
            res["special_ids"] = json.loads((tmp / "sp.json").read_text())["ids"]
            V, T = res["n_vocab"], len(res["ids"])
            logits = np.fromfile(tmp / f"{preset}.f32", dtype=np.float32).reshape(T, V)
            pos = positions(T)
            np.save(GOLDEN / f"{name}.npy", logits[pos])
            if n_ctx is not None:
                res["n_ctx"] = n_ctx
            res |= {
                "preset": preset,
                "positions": pos,
                "source": "llama.cpp (llama-cpp-python 0.3.36's vendored tree), CPU, "
                "scripts/llama_oracle.cpp",
            }
            (GOLDEN / f"{name}.json").write_text(json.dumps(res) + "\n")
            print(f"{name}: {T} prompt tokens, greedy {res['greedy'][:8]}...")


if __name__ == "__main__":
    main()
