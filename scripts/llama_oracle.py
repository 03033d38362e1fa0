"""llama.cpp's answers on minfer's tiny synthetic family files -> tests/golden/families/.

For each preset of FAMILIES: write the tiny F16 synthetic model (`minfer synth`, a generated
byte-level vocab of 1024), run llama.cpp on PROMPT through scripts/llama_oracle.cpp (libllama,
CPU), and keep what the tests compare against: llama.cpp's prompt ids, 32 greedy ids with
their margins, and its logits at POSITIONS of the prompt (float32). The synthetic file is
deterministic, so CI rebuilds it and needs no llama.cpp.

    python3 scripts/llama_oracle.py --llama /tmp/llama.cpp [--presets tiny-llama3,...]

--llama: a llama.cpp tree built for the CPU with the `llama` target (../shared/llamacpp/
README.md; `cmake --build build --target llama`).
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

from families_data import FAMILIES, GOLDEN, PROMPT, positions, synth_family  # noqa: E402


def build(llama: Path, out: Path) -> Path:
    exe = out / "llama_oracle"
    lib = llama / "build" / "bin"
    subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "scripts" / "llama_oracle.cpp"),
                    f"-I{llama / 'include'}", f"-I{llama / 'ggml' / 'include'}", f"-L{lib}",
                    "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-o", str(exe)],
                   check=True)
    return exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama", type=Path, required=True, help="a llama.cpp CPU build tree")
    ap.add_argument("--presets", default=",".join(FAMILIES))
    a = ap.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        exe = build(a.llama, tmp)
        (tmp / "prompt.txt").write_text(PROMPT)
        for preset in a.presets.split(","):
            model = synth_family(preset, tmp)
            subprocess.run([str(exe), str(model), str(tmp / "prompt.txt"), str(tmp / preset)],
                           check=True, stderr=subprocess.DEVNULL)
            res = json.loads((tmp / f"{preset}.json").read_text())
            V, T = res["n_vocab"], len(res["ids"])
            logits = np.fromfile(tmp / f"{preset}.f32", dtype=np.float32).reshape(T, V)
            pos = positions(T)
            np.save(GOLDEN / f"{preset}.npy", logits[pos])
            res |= {"preset": preset, "positions": pos,
                    "source": "llama.cpp (llama-cpp-python 0.3.36's vendored tree), CPU, "
                              "scripts/llama_oracle.cpp"}
            (GOLDEN / f"{preset}.json").write_text(json.dumps(res) + "\n")
            print(f"{preset}: {T} prompt tokens, greedy {res['greedy'][:8]}...")


if __name__ == "__main__":
    main()
