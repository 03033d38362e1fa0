"""minfer's CUDA backend: kernel build/cache (build.py, no GPU needed), the pycuda runtime
(runtime.py), one launcher module per kernel family, and the dispatch that picks a path."""
