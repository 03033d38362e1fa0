"""The host side of a run: signals, threads, host memory, files, worker pools, progress bars."""
