"""A refactor's no-GPU check: digests of everything the CUDA backend does on the fake devices of
the CPU tests, to compare two trees (before / after) line by line.

    python3 lab/fake_device_trace.py TREE > a.txt   # TREE: a checkout (e.g. `git archive` of
    python3 lab/fake_device_trace.py .    > b.txt   # the base commit), then diff a.txt b.txt

Per model (tiny synthetic q4_K_M, q6_K, q8_0), GEMM choice and tuning variant, arch, chunk:
- upload: load_weights on tests/test_upload_cpu.MemRT (memory a numpy array, dequant and blk
  requant by their twins): every allocation (pointer, bytes, label), launch (entry, grid,
  block, arguments), host->device copy size, free, the final device memory and the weights;
- plan: sizes.plan_memory / memory_need of the routes (sorted parts);
- forward: CudaBackend on tests/test_backend_forward_cpu.FakeRT (no kernel runs): every launch
  of the load, two prefill chunks, a decode step and window_logits, arguments (pointers
  included) and grids.
Measured when the paths became packages (load, sizes and buffers moved into them): identical
digests for every line against the tree before."""

from __future__ import annotations

import hashlib
import pathlib
import sys
import tempfile
import types

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import pytest  # noqa: E402

CHOICES = ["f16", "f16:no-glu", "f16:no-rope", "wide-kd4", "wide-kd8", "narrow", "r1", "blk",
           "blk:no-glu", "blk:no-fused-prepass", "blk:no-token-scale", "blk:no-exact-down",
           "auto"]  # fmt: skip


def _h(x) -> str:
    return hashlib.sha256(repr(x).encode() if not isinstance(x, bytes) else x).hexdigest()[:16]


def _arg(a):
    if isinstance(a, np.ndarray):
        return a.tobytes().hex()
    try:
        return repr(a.item())
    except Exception:
        return repr(int(a)) if isinstance(a, int) else type(a).__name__


def upload(models) -> None:
    import test_upload_cpu as T

    from minfer.cuda.load.weights import load_weights
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.fusion import plan_fusion, plan_glu
    from minfer.cuda.plan.routes import plan_routes
    from minfer.cuda.plan.sizes import memory_need, plan_memory, upload_slot
    from minfer.cuda.runtime import devarray

    devarray._ga = lambda: types.SimpleNamespace(GPUArray=T._Arr)

    class Rec(T.MemRT):
        def alloc(self, nbytes, what="buffer"):
            p = super().alloc(nbytes, what)
            self.log.append(("alloc", int(p), int(nbytes), what))
            return p

        def launch(self, fn, grid, block, args, smem=0, stream=None):
            self.log.append((fn._minfer_name, tuple(grid), tuple(block), tuple(map(_arg, args))))
            super().launch(fn, grid, block, args, smem, stream)

    for mname, model in models.items():
        for gemm in CHOICES:
            for arch in ("sm_80", "sm_90"):
                for chunk in (4 << 10, 64 << 20):
                    rt = T._Arr.rt = Rec()
                    rt.log, rt.arch = [], arch
                    choice = GemmChoice.parse_ab(gemm, {})
                    routes = plan_routes(model, choice, rt, 64)
                    fused = plan_fusion(model, routes)
                    glu = frozenset(plan_glu(model, choice, routes, fused))
                    dw = load_weights(
                        rt, model, routes, fused, upload_slot(model, routes, chunk), False, glu
                    )
                    ws = {
                        k: (int(v.wb.gpudata), v.wb.shape) if hasattr(v, "wb")
                        else (int(v.gpudata), v.shape, str(v.dtype))
                        for k, v in sorted(dw.w.items())
                    }  # fmt: skip
                    mem = _h(rt.mem[: rt.top].tobytes())
                    log = _h((rt.log, ws, sorted(dw.qtypes.items()), rt.htod, sorted(rt.freed)))
                    print("upload", mname, gemm, arch, chunk, mem, log, len(rt.log))
                plan = [
                    sorted(f(model, *a).items())
                    for f, a in (
                        (plan_memory, (routes, 128, 64, 132)),
                        (memory_need, (choice, routes, 4096, 512, 0)),
                    )
                ]
                print("plan", mname, gemm, arch, _h(plan))


def forward(model) -> None:
    import test_backend_forward_cpu as F
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    mp = pytest.MonkeyPatch()
    install(mp)
    mp.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=F._Arr))
    F.fake_tensor_maps(mp)

    class Rec(F.FakeRT):
        def launch(self, fn, grid, block, args, smem=0, stream=None):
            self.launches.append(fn)
            self.log.append((fn, tuple(grid), tuple(block), tuple(map(_arg, args)), int(smem)))

    for gemm in CHOICES:
        for arch in ("sm_80", "sm_90"):
            rt = Rec(arch)
            rt.log = []
            choice = GemmChoice.parse_ab(gemm, {})
            be = CudaBackend(
                model, choice, rt=rt, max_tokens=64, ubatch=16, warmup=False, graphs=False
            )
            n = len(rt.log)
            be.forward_device(np.arange(21, dtype=np.int32) % 50, 0)
            be.forward_device(np.array([3], np.int32), 21)
            be.window_logits(np.arange(20, dtype=np.int32) % 50, 5)
            print("forward", gemm, arch, _h(rt.log), n, len(rt.log))
    mp.undo()


def main() -> None:
    from synth_data import tiny_model

    from minfer.gguf.loader import load_model

    tmp = pathlib.Path(tempfile.mkdtemp())
    models = {}
    for name, seed, qt in (("q4_K_M", 4, "q4_K_M"), ("q6_K", 5, "q6_K"), ("q8_0", 6, "q8_0")):
        (tmp / name).mkdir()
        models[name] = load_model(tiny_model(tmp / name, seed=seed, qtype=qt))
    (tmp / "fwd").mkdir()
    forward(load_model(tiny_model(tmp / "fwd", seed=3, workers=None)))
    upload(models)


if __name__ == "__main__":
    main()
