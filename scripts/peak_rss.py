"""Run a command; print its exit status, wall time and peak resident memory (its children's
maximum RSS, from getrusage) on stderr last. Usage: python3 scripts/peak_rss.py CMD ARGS..."""

import resource
import subprocess
import sys
import time

t0 = time.perf_counter()
rc = subprocess.call(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB on Linux
print(
    f"peak_rss: rc={rc}, wall {time.perf_counter() - t0:.1f} s, peak host RSS {peak:.0f} MiB",
    file=sys.stderr,
)
sys.exit(rc)
