"""Host memory headroom: how many bytes this process can still allocate, before it tries.

A numpy allocation beyond what the machine or the process limits allow ends in a MemoryError
(or the OOM killer) after the work has started; the CPU backend asks here first and refuses
with one line naming both numbers. The headroom is the smallest of:
  MemAvailable (/proc/meminfo)              RAM the kernel can give without swapping
  RLIMIT_AS  - the current address space    `ulimit -v` (the file's memory map counts here)
  RLIMIT_DATA - the current data segment    `ulimit -d` (counted like RLIMIT_AS since Linux 4.7)
Each one that cannot be read (not Linux, no /proc) is left out; None when none can be.
"""

from __future__ import annotations

import resource

from minfer.errors import ResourceError


def _status_kib(field: str) -> int | None:
    """A `kB` field of /proc/self/status (VmSize, VmData) in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def headroom() -> tuple[int | None, str]:
    """(bytes this process can still allocate, which limit decides it) or (None, "")."""
    cands: list[tuple[int, str]] = []
    avail = mem_available()
    if avail is not None:
        cands.append((avail, "MemAvailable"))
    for lim, field, name in ((resource.RLIMIT_AS, "VmSize", "ulimit -v"),
                             (resource.RLIMIT_DATA, "VmData", "ulimit -d")):
        soft = resource.getrlimit(lim)[0]
        used = _status_kib(field)
        if soft != resource.RLIM_INFINITY and used is not None:
            cands.append((max(soft - used, 0), name))
    if not cands:
        return None, ""
    return min(cands)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def require(nbytes: int, what: str, margin: float = 1.05) -> None:
    """ResourceError when `what` (nbytes, plus a margin for allocator slack) does not fit the
    headroom. No check when the headroom is unknown. Refusing before is the point: under
    `ulimit -v` some numpy paths crash (SIGSEGV, seen in gguf's dequant) instead of raising
    MemoryError when an allocation fails."""
    room, limit = headroom()
    need = int(nbytes * margin)
    if room is not None and need > room:
        raise ResourceError(f"not enough host memory for {what}: {fmt_bytes(need)} needed, "
                            f"{fmt_bytes(room)} available ({limit})")


def out_of_memory(what: str) -> ResourceError:
    """The one-line error for a MemoryError caught while doing `what`."""
    room, limit = headroom()
    have = f"; {fmt_bytes(room)} available ({limit})" if room is not None else ""
    return ResourceError(f"out of host memory while {what}{have}")
