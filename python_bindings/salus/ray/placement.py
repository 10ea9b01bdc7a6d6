"""Where a trial goes: Salus's admission rule across GPUs (no Ray here, so it is tested alone).

A GPU shared the Salus way keeps every admitted job's persistent memory resident and lets the
jobs take turns over one ephemeral region, so the memory it needs for a set of trials is

    sum(persistent) + max(ephemeral peak)

(DESIGN.md, "shared persistent/ephemeral pools"). Policies that overlap iterations (pack,
memory_aware) do so only when the memory fits at that moment, so the rule holds for every
built-in policy. A trial fits a GPU when that sum, with the trial added, stays within the GPU's
capacity (and the GPU runs fewer trials than ``max_trials``, when one is set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

PLACEMENTS = ("spread", "pack")


@dataclass(frozen=True)
class Need:
    """What a trial holds on its GPU: resident for its life, and at the peak of an iteration."""

    persistent: int
    ephemeral_peak: int
    exclusive: bool = False  # a GPU of its own (what it needs is not known yet)

    @property
    def total(self) -> int:
        return self.persistent + self.ephemeral_peak


@dataclass
class GpuLoad:
    """One GPU's admitted trials and what they need."""

    capacity: int
    max_trials: Optional[int] = None
    needs: dict[str, Need] = field(default_factory=dict)  # by trial id

    def committed(self, extra: Optional[Need] = None) -> int:
        """Bytes the admission rule holds for the admitted trials (and ``extra``)."""
        needs = list(self.needs.values()) + ([extra] if extra is not None else [])
        if not needs:
            return 0
        if any(n.exclusive for n in needs):
            return self.capacity if len(needs) == 1 else self.capacity + 1
        return sum(n.persistent for n in needs) + max(n.ephemeral_peak for n in needs)

    def fits(self, need: Need) -> bool:
        if self.max_trials is not None and len(self.needs) >= self.max_trials:
            return False
        return self.committed(need) <= self.capacity

    def fits_alone(self, need: Need) -> bool:
        return need.exclusive or need.total <= self.capacity


def choose(loads: list[GpuLoad], need: Need, placement: str = "spread") -> Optional[int]:
    """The GPU for a trial that needs ``need``, or None when none fits now.

    "spread": the fitting GPU running the fewest trials (then the most bytes left), so that
    trials share compute as little as they can; "pack": the first GPU where it fits, which
    leaves the others free for large trials. Ties go to the lowest index.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    fitting = [i for i, load in enumerate(loads) if load.fits(need)]
    if not fitting:
        return None
    if placement == "pack":
        return fitting[0]
    return min(fitting, key=lambda i: (len(loads[i].needs), loads[i].committed(need) -
                                       loads[i].capacity, i))
