"""BLAS threads for the CPU backend: `-t/--threads N`, default the physical cores we may use.

numpy's BLAS (OpenBLAS, MKL) starts one thread per logical CPU of the machine, whatever the
process's CPU affinity or the load: on a busy 2-core machine the CPU prefill ran at 1.6 tok/s,
against 31.8 with one BLAS thread. The limit is set through threadpoolctl (a dependency: the one
maintained way to resize an already loaded BLAS pool, for OpenBLAS, MKL and BLIS alike); without
it, the OPENBLAS/OMP/MKL_NUM_THREADS variables are set, which only work when numpy has not yet
been imported (the CLI imports it lazily, so for `minfer prefill` they still do).

Default: the physical cores among the CPUs this process may run on (os.sched_getaffinity, each
core counted once however many SMT siblings it has, from /sys topology), else that CPU count.
"""

from __future__ import annotations

import os

import click

from minfer.errors import BadInput

_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
_limits = None  # the threadpoolctl limiter in force (kept so the limit stays set)
_current: int | None = None  # the limit set_threads last set (None: never called)


def _usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def physical_cores() -> int:
    """Physical cores among the CPUs this process may use (SMT siblings counted once)."""
    cpus = _usable_cpus()
    cores = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return max(len(cpus), 1)
    return max(len(cores), 1)


def set_threads(n: int) -> str:
    """Limit the BLAS / OpenMP pools to n threads; returns how ("threadpoolctl" or "env")."""
    global _limits, _current
    if n < 1:
        raise BadInput(f"--threads must be >= 1, got {n}")
    _current = n
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # effective only if numpy is imported after this
        for k in _ENV:
            os.environ[k] = str(n)
        return "env"
    for k in _ENV:  # for a BLAS loaded later (and child processes)
        os.environ[k] = str(n)
    _limits = threadpool_limits(limits=n)  # for the ones already loaded
    return "threadpoolctl"


def current() -> int | None:
    """The limit set_threads last set (the CLI's -t, or an Engine's threads=), else None."""
    return _current


def _apply(ctx: click.Context, param: click.Parameter, value: int | None) -> int:
    n = physical_cores() if value is None else value
    set_threads(n)  # env for a BLAS not loaded yet, threadpoolctl for one already loaded
    return n


threads_option = click.option(
    "-t",
    "--threads",
    type=int,
    default=None,
    expose_value=False,
    callback=_apply,
    help="BLAS threads for the CPU backend (default: the physical cores this process may use).",
)
