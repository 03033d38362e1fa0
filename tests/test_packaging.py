"""CPU: a non-editable install ships the CUDA sources and the package data (minfer/data). The wheel (built from the tree and from
the sdist) holds every kernels/*.cu and *.cuh under minfer/cuda/kernels, the sdist holds the
top-level kernels/, and an installed layout (the wheel unpacked into a target, imported from
another directory) resolves KERNEL_DIR to the shipped copy.

Builds run on a copy of the tree's packaging inputs (an in-tree build would leave build/ and
*.egg-info in the checkout). Without network (pip's isolated build env) and without a local
wheel builder the wheel tests skip, saying so."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from minfer.cuda.runtime.build import find_kernel_dir

ROOT = Path(__file__).resolve().parent.parent
KERNELS = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh"))
INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "minfer", "kernels")


def _copy_tree(dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(
                src,
                dst / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.cubin", "*.so"),
            )
        else:
            shutil.copy2(src, dst / name)
    return dst


def _local_wheel_builder() -> bool:
    """setuptools can build a wheel without pip's isolated env (wheel installed, or setuptools
    >= 70.1 with its own bdist_wheel)."""
    return (
        importlib.util.find_spec("wheel") is not None
        or importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
    )


def _pip_wheel(src: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(out)]
    if _local_wheel_builder():
        cmd.insert(5, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        offline = any(
            s in r.stderr
            for s in (
                "Could not find a version",
                "NewConnectionError",
                "Network is unreachable",
                "No matching distribution",
            )
        )
        if offline and "--no-build-isolation" not in cmd:
            pytest.skip(
                "no local wheel builder (wheel / setuptools>=70.1) and pip cannot fetch "
                "one for its isolated build env (offline)"
            )
        raise AssertionError(f"pip wheel failed:\n{r.stderr[-3000:]}")
    (whl,) = out.glob("minfer-*.whl")
    return whl


def _wheel_kernels(whl: Path) -> list[str]:
    pre = "minfer/cuda/kernels/"
    names = zipfile.ZipFile(whl).namelist()
    return sorted(n[len(pre) :] for n in names if n.startswith(pre))


def _sdist(src: Path, out: Path) -> Path:
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    r = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out / r.stdout.strip().splitlines()[-1]


def test_repo_has_kernels():
    assert "gemm_f16.cu" in KERNELS and any(k.endswith(".cuh") for k in KERNELS)


def test_wheel_ships_every_kernel_and_resolves_them_installed(tmp_path):
    whl = _pip_wheel(_copy_tree(tmp_path / "src"), tmp_path / "whl")
    assert _wheel_kernels(whl) == KERNELS
    # the installed layout: the wheel unpacked into a target, used from another directory
    target = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "from minfer.cuda.runtime.build import KERNEL_DIR, kernel_path; "
        "from minfer.tools.perplexity.windows import DEFAULT_TEXT; "
        "print(KERNEL_DIR); print(kernel_path('gemm_f16')); print(DEFAULT_TEXT)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    kdir, gemm, text = r.stdout.split()
    assert Path(kdir) == target / "minfer" / "cuda" / "kernels"
    assert Path(gemm).read_bytes() == (ROOT / "kernels" / "gemm_f16.cu").read_bytes()
    # the default text of `minfer perplexity` is package data
    assert Path(text) == target / "minfer" / "data" / "gnu-gpl.txt"
    assert Path(text).read_bytes() == (ROOT / "minfer" / "data" / "gnu-gpl.txt").read_bytes()


def test_sdist_carries_kernels_and_its_wheel_ships_them(tmp_path):
    sd = _sdist(_copy_tree(tmp_path / "src"), tmp_path / "sdist")
    with tarfile.open(sd) as tf:
        names = tf.getnames()
        top = names[0].split("/")[0]
        got = sorted(
            n.split("/")[-1]
            for n in names
            if n.startswith(f"{top}/kernels/") and n.endswith((".cu", ".cuh"))
        )
        assert got == KERNELS
        assert f"{top}/setup.py" in names and f"{top}/MANIFEST.in" in names
        tf.extractall(tmp_path / "unpacked")
    # what `pip install minfer-x.tar.gz` does: a wheel built from the unpacked sdist
    whl = _pip_wheel(tmp_path / "unpacked" / top, tmp_path / "whl")
    assert _wheel_kernels(whl) == KERNELS
    assert {"minfer/data/gnu-gpl.txt", "minfer/data/README.md"} <= set(
        zipfile.ZipFile(whl).namelist()
    )


def test_kernel_dir_lookup(tmp_path):
    """Checkout (kernels/ beside pyproject.toml) first; an installed package uses its own
    minfer/cuda/kernels, even with a stray site-packages/kernels next to it."""
    checkout = tmp_path / "checkout"
    (checkout / "minfer" / "cuda").mkdir(parents=True)
    (checkout / "kernels").mkdir()
    (checkout / "pyproject.toml").write_text("")
    assert find_kernel_dir(checkout / "minfer" / "cuda") == checkout / "kernels"
    site = tmp_path / "site-packages"
    (site / "minfer" / "cuda" / "kernels").mkdir(parents=True)
    (site / "kernels").mkdir()  # another distribution's top-level "kernels" package
    assert find_kernel_dir(site / "minfer" / "cuda") == site / "minfer" / "cuda" / "kernels"
    assert find_kernel_dir() == ROOT / "kernels"  # this checkout
