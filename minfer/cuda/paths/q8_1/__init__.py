"""The seeds' exact int8 family as one package: the path records r1, narrow, wide-kd4, wide-kd8
and their route (path.py), their launchers (launch.py: the q8_1 prepass, the MMQ kernels, the
smem guard's sizes), their numpy twin on the q8_1 grid (twin.py)."""

from minfer.cuda.paths.q8_1.path import (
    NARROW,
    Q8_1,
    R1,
    WIDE_KD4,
    WIDE_KD8,
    RawInt8Path,
    RawInt8Route,
)

__all__ = ["NARROW", "Q8_1", "R1", "WIDE_KD4", "WIDE_KD8", "RawInt8Path", "RawInt8Route"]
