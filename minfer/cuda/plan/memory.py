"""The memory decision of the CUDA backend: which plan runs, given what each candidate needs and
what the GPU has free (docs/paths.md, "Memory tiers"). Pure Python, no GPU.

- `choose_tier(need, free, forced)` -> MemoryPlan: for `--gemm auto`, `need` holds each memory
  tier's whole plan in bytes (weights, KV cache, activations, scratch: sizes.plan_memory), in
  paths.auto_tiers' order (fastest first), and the first whose need plus MARGIN fits `free` is
  chosen (the smallest when none does: its memory check then names what is missing); for a forced
  path (`--gemm NAME`) `need` holds that path's plan and `alt` the auto tiers' (the refusal's
  suggestions, computed only when it does not fit).
- `MemoryPlan.line()`: the `memory` line prefill / bench / check print; `.refusal()`: the one
  error line of a forced path that does not fit; `.as_json()`: the numbers for --json.
Every size in these lines is in GB (1e9 bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MARGIN = 250_000_000  # bytes a plan leaves free (the driver, the allocator's rounding)


def gb(n: float) -> str:
    """'141.2 GB' from 1 GB up, else three significant digits ('0.25 GB', '0.00523 GB')."""
    x = n / 1e9
    if x >= 1 or x <= 0:
        return f"{x:.1f} GB"
    s = f"{x:.{min(12, 2 - math.floor(math.log10(x)))}f}".rstrip("0")
    return f"{s} GB"


@dataclass(frozen=True)
class MemoryPlan:
    """tiers: tier (auto) or path (forced) -> bytes its plan needs, in the order tried; free:
    the device's free bytes (None: unknown, nothing checked); chosen: the tier / path that
    runs; forced: the --gemm path ("" for auto); alt: auto tier -> need, for a forced path
    that does not fit (paths.TIERS[t].path forces the unmixed ones)."""

    tiers: dict[str, int]
    free: int | None
    margin: int
    chosen: str
    forced: str = ""
    alt: dict[str, int] = field(default_factory=dict)

    @property
    def need(self) -> int:
        return self.tiers[self.chosen]

    @property
    def fits(self) -> bool:
        return self.free is None or self.need + self.margin <= self.free

    def fitting(self) -> list[str]:
        """The --gemm values that would fit instead of a forced path: the unmixed auto tiers'
        paths that fit (fastest first) and `auto` when any tier fits."""
        from minfer.cuda.paths import TIERS

        if self.free is None:
            return []
        ok = [t for t, n in self.alt.items() if n + self.margin <= self.free]
        out = [
            f"--gemm {TIERS[t].path} ({gb(self.alt[t])})"
            for t in ok
            if TIERS[t].classes is None and TIERS[t].qtypes is None and TIERS[t].path != self.forced
        ]
        return out + (["--gemm auto"] if ok else [])

    def line(self) -> str:
        """'f16 plan 14.8 GB of 139.1 GB free'; 'f16 would need 141.2 GB, 138.9 GB free -> blk,
        73.4 GB (margin 0.25 GB)'; 'blk plan 10.8 GB of 139.0 GB free (--gemm blk)'."""
        free = "unknown free memory" if self.free is None else f"{gb(self.free)} free"
        if self.forced:
            return f"{self.chosen} plan {gb(self.need)} of {free} (--gemm {self.forced})"
        names = list(self.tiers)
        skipped = names[: names.index(self.chosen)]
        if not skipped:
            return f"{self.chosen} plan {gb(self.need)} of {free}"
        first, *rest = skipped
        miss = ", ".join(
            [f"{first} would need {gb(self.tiers[first])}"]
            + [f"{t} {gb(self.tiers[t])}" for t in rest]
        )
        return f"{miss}, {free} -> {self.chosen}, {gb(self.need)} (margin {gb(self.margin)})"

    def refusal(self) -> str:
        """The error line of a forced path that does not fit, naming the paths that would."""
        instead = self.fitting()
        tail = (
            (
                ": "
                + (", ".join(instead[:-1]) + " or " if len(instead) > 1 else "")
                + instead[-1]
                + " fits"
            )
            if instead
            else ""
        )
        return (
            f"--gemm {self.forced} needs {gb(self.need)} of GPU memory, "
            f"{gb(self.free or 0)} free{tail}"
        )

    def as_json(self) -> dict:
        return {
            "tiers": dict(self.tiers),
            "free": self.free,
            "margin": self.margin,
            "chosen": self.chosen,
            "forced": self.forced or None,
            "reason": self.reason(),
        }

    def reason(self) -> str:
        if self.forced:
            return "forced by --gemm" + ("" if self.fits else ", does not fit")
        if self.free is None:
            return "free memory unknown: the fastest tier"
        if not self.fits:
            return "no tier fits: the smallest"
        i = list(self.tiers).index(self.chosen)
        return "the fastest tier" if i == 0 else "the fastest tier that fits"


def choose_tier(
    need: dict[str, int],
    free: int | None,
    margin: int = MARGIN,
    forced: str = "",
    alt: dict[str, int] | None = None,
) -> MemoryPlan:
    """The first tier (need's order) whose need plus `margin` fits `free`; the smallest when
    none does; the first when free memory is unknown. forced: need holds that one path."""
    tiers = list(need)
    chosen = tiers[0]
    if free is not None and not forced:
        chosen = next(
            (t for t in tiers if need[t] + margin <= free), min(tiers, key=lambda t: need[t])
        )
    return MemoryPlan(dict(need), free, margin, chosen, forced, dict(alt or {}))
