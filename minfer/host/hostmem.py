"""Host memory headroom: how many bytes this process can still allocate, before it tries.

A numpy allocation beyond what the machine or the process limits allow ends in a MemoryError
(or the OOM killer) after the work has started; the CPU backend asks here first and refuses
with one line naming both numbers. The headroom is the smallest of:
  MemAvailable (/proc/meminfo)              RAM the kernel can give without swapping
  RLIMIT_AS  - the current address space    `ulimit -v` (the file's memory map counts here)
  RLIMIT_DATA - the current data segment    `ulimit -d` (counted like RLIMIT_AS since Linux 4.7)
Each one that cannot be read (not Linux, no /proc) is left out; None when none can be.
`starved(e)` tells the CLI whether an exception escaping a command means memory ran out.
"""

from __future__ import annotations

import errno

try:
    import resource  # an extension module: loaded early (minfer.cli) while memory is there
except ImportError:  # starved already, or not Unix: no limits to read
    resource = None

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
    for soft, field, name in _limits():
        used = _status_kib(field)
        if used is not None:
            cands.append((max(soft - used, 0), name))
    if not cands:
        return None, ""
    return min(cands)


def _limits() -> list[tuple[int, str, str]]:
    """(soft limit, /proc/self/status field, its name) for each finite address-space limit."""
    if resource is None:
        return []
    out = []
    for lim, field, name in (
        (resource.RLIMIT_AS, "VmSize", "ulimit -v"),
        (resource.RLIMIT_DATA, "VmData", "ulimit -d"),
    ):
        soft = resource.getrlimit(lim)[0]
        if soft != resource.RLIM_INFINITY:
            out.append((soft, field, name))
    return out


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
        raise ResourceError(
            f"not enough host memory for {what}: {fmt_bytes(need)} needed, "
            f"{fmt_bytes(room)} available ({limit})"
        )


def out_of_memory(what: str) -> ResourceError:
    """The one-line error for a MemoryError caught while doing `what`."""
    room, limit = headroom()
    have = f"; {fmt_bytes(room)} available ({limit})" if room is not None else ""
    return ResourceError(f"out of host memory while {what}{have}")


# what failing allocations look like where they are not a MemoryError (a worker's MemoryError
# comes back as a pool's MaybeEncodingError naming it)
_NO_MEMORY_TEXT = (
    "failed to map segment",
    "cannot allocate memory",
    "can't start new thread",
    "out of memory",
    "memoryerror",
)


def starved(e: BaseException) -> str | None:
    """The one-line message when `e` (escaping a command) means host memory ran out, else None.
    Besides a MemoryError or ENOMEM in its chain: under an address-space limit (ulimit -v / -d)
    a module may fail to load with an ImportError or SystemError that names no memory at all."""
    seen, chain = set(), e
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if (
            isinstance(chain, MemoryError)
            or (isinstance(chain, OSError) and chain.errno == errno.ENOMEM)
            or any(t in str(chain).lower() for t in _NO_MEMORY_TEXT)
        ):
            break
        chain = chain.__cause__ or chain.__context__
    else:
        # (no `resource` module: it could not load at start, so memory was short already)
        if not (isinstance(e, (ImportError, SystemError)) and (resource is None or _limits())):
            return None
        chain = e
    lines = [x.strip() for x in str(chain).splitlines() if x.strip()]
    # the line that names the memory (numpy's ImportError: a page of advice, then the cause)
    text = next(
        (x for x in lines if any(t in x.lower() for t in _NO_MEMORY_TEXT)),
        lines[0] if lines else getattr(chain, "name", None) or "",
    )
    if not isinstance(chain, MemoryError) and "memoryerror" in text.lower():
        text = "MemoryError in a worker process"  # a pool's MaybeEncodingError: the result's repr
    text = text if len(text) <= 160 else text[:157] + "..."
    why = f"{type(chain).__name__}: {text}" if text else type(chain).__name__
    room, limit = headroom()
    have = f"; {fmt_bytes(room)} available ({limit})" if room is not None else ""
    return f"out of host memory ({why}){have}"
