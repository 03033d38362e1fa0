"""Kernel launchers, one module per kernel family (attention, dequant, f16 GEMM, layers, the int8
MMQ kernels, the block-scaled int8 GEMM, stream-K). Imports the runtime only, never plan/ or
paths/."""
