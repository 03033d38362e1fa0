"""The CUDA runtime, below every launcher: kernel build and cubin cache (build.py, no GPU needed),
the pycuda context and launches (runtime.py), device arrays, CUDA graphs, TMA descriptors and
per-op profiling. Imports nothing from ops/ or plan/."""
