"""Statistics reach Python whole: the dataclasses hold exactly the fields of the C++ lists
(``salus/stats_fields.h``), and what the binding returns fills them. A field added to a list and
not to the dataclass (or the other way round) fails here."""
from __future__ import annotations

import dataclasses

import salus
from salus import _salus


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_device_stats_has_every_listed_field_and_no_other() -> None:
    listed = [name for name, _ in _salus.device_stats_fields()]
    assert _names(salus.DeviceStats) == listed + ["persistent", "ephemeral"]


def test_class_bytes_has_every_listed_field_and_no_other() -> None:
    assert _names(salus.ClassBytes) == [name for name, _ in _salus.class_bytes_fields()]


def test_every_listed_field_says_what_it_counts() -> None:
    for name, what in _salus.device_stats_fields() + _salus.class_bytes_fields():
        assert what, f"{name} has no description in salus/stats_fields.h"


def test_device_stats_are_filled_from_the_runtime() -> None:
    rt = salus.Runtime(backend="sim", devices=1, memory=64 << 20)
    job = rt.add_job("stats")
    with job.iteration():
        block = job.allocate(3 << 20)
    stats = rt.device_stats(0)
    assert stats.device == 0 and stats.limit == 64 << 20
    assert stats.allocations == 1 and stats.page_maps > 0 and stats.chunk_creates > 0
    assert stats.persistent.in_use + stats.ephemeral.in_use == stats.allocated > 0
    assert stats.persistent.blocks + stats.ephemeral.blocks == 1
    assert isinstance(stats.move_seconds, float)
    job.deallocate(block)
    assert rt.device_stats(0).allocated == 0
