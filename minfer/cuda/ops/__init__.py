"""Kernel launchers, one module per kernel family (attention, dequant, f16 GEMM, layers, the int8
MMQ kernels, the block-scaled int8 GEMM, stream-K), and path_ops: each GEMM path's prepare, launch and
numpy twin. Imports the runtime only, never plan/."""
