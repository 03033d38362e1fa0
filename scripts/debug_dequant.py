"""Debug (device): dequant_f16 on the GPU vs dequant_f16_ref, per tensor type of a model."""
import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.dequant import dequant_f16, dequant_f16_ref
from minfer.cuda.runtime import get_runtime
from minfer.loader import load_model

rt = get_runtime()
seen = set()
for p in sys.argv[1:]:
    m = load_model(p)
    for n, t in m.tensors.items():
        if len(t.shape) != 2 or t.type_name in seen:
            continue
        seen.add(t.type_name)
        N, K = t.shape
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        src = da.to_device(rt, raw)
        out = da.to_device(rt, np.full((N, K), np.nan, np.float16))
        dequant_f16(rt, src, t.qtype, N, K, out_dev=out)
        got, ref = out.get(), dequant_f16_ref(raw, t.qtype, N, K)
        eq = np.array_equal(got.view(np.uint16), ref.view(np.uint16))
        bad = np.flatnonzero(got.view(np.uint16).ravel() != ref.view(np.uint16).ravel())
        print(f"{t.type_name:6s} {n:28s} [{N},{K}] bitwise {eq}, nonfinite "
              f"{int((~np.isfinite(got)).sum())}, first bad {bad[:4]} got "
              f"{got.ravel()[bad[:4]]} ref {ref.ravel()[bad[:4]]}")
