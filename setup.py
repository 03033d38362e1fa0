"""Packaging hook: the CUDA sources ship inside the package (minfer/cuda/kernels) although the
repository keeps them at the top (kernels/, docs/design.md's layout). Everything else is in
pyproject.toml; MANIFEST.in puts kernels/ into the sdist, so a wheel built from it has them too.
An editable install copies nothing: minfer/cuda/runtime/build.py finds the checkout's kernels/
first."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_SUFFIXES = (".cu", ".cuh")


class build_py_with_kernels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        src = Path(__file__).resolve().parent / "kernels"
        dst = Path(self.build_lib) / "minfer" / "cuda" / "kernels"
        files = sorted(p for p in src.iterdir() if p.suffix in KERNEL_SUFFIXES)
        if not files:
            raise SystemExit(f"error: no CUDA sources in {src} (the wheel would ship none)")
        self.mkpath(str(dst))
        for p in files:
            self.copy_file(str(p), str(dst / p.name))


setup(cmdclass={"build_py": build_py_with_kernels})
