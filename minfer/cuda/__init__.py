"""minfer's CUDA backend, in layers (each imports only the ones below it; tests/test_imports.py):
runtime/ (kernel build and cache, no GPU needed; the pycuda runtime, device arrays, graphs),
ops/ (one launcher module per kernel family), plan/ (the GEMM path table and its chooser, the
routes, fusion, weight upload, kernel prebuild), and backend.py on top (the engine's entry)."""
