"""The exact f16 path as one package: the path record and its route (path.py), its launcher
(gemm.py: gemm_f16_nt, the GEMV, the glu and rope epilogues); its twin is the f16-rounded
float64 product (path.F16Path.twin)."""

from minfer.cuda.paths.f16.path import F16, F16Path, F16Route

__all__ = ["F16", "F16Path", "F16Route"]
