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


# What JobMemory holds besides the listed fields: what no scalar holds (salus/stats_fields.h).
_JOB_MEMORY_BY_HAND = ["persistent", "ephemeral", "in_use_by_device", "in_use_by_tier"]


def test_job_memory_has_every_listed_field_and_no_other() -> None:
    listed = [name for name, _ in _salus.job_memory_stats_fields()]
    held = _names(salus.JobMemory)
    assert [n for n in listed if n not in held] == [], "listed, missing from JobMemory"
    assert [n for n in held if n not in listed + _JOB_MEMORY_BY_HAND] == [], \
        "in JobMemory, not listed in SALUS_JOB_MEMORY_STATS_FIELDS"
    assert held == listed + _JOB_MEMORY_BY_HAND  # and in the list's order


def test_job_stats_has_every_listed_field_and_no_other() -> None:
    listed = [name for name, _ in _salus.job_stats_fields()]
    assert _names(salus.JobStats) == (["id", "name", "kind", "device", "lane", "state"] + listed
                                      + ["memory"])


def test_class_bytes_has_every_listed_field_and_no_other() -> None:
    assert _names(salus.ClassBytes) == [name for name, _ in _salus.class_bytes_fields()]


def test_every_listed_field_says_what_it_counts() -> None:
    for name, what in (_salus.device_stats_fields() + _salus.class_bytes_fields()
                       + _salus.job_memory_stats_fields() + _salus.job_stats_fields()):
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


def test_job_memory_is_filled_from_the_runtime() -> None:
    rt = salus.Runtime(backend="sim", devices=1, memory=64 << 20)
    job = rt.add_job("stats")
    with job.iteration():
        block = job.allocate(3 << 20)
        during = job.stats().memory
    assert during.in_use == during.peak == during.in_use_by_tier[0] == 3 << 20
    assert during.in_use_by_device == [3 << 20] and during.in_use_by_tier[1:] == [0, 0]
    assert during.ephemeral.in_use + during.persistent.in_use == 3 << 20
    assert during.quiescent is False
    assert isinstance(during.activations, int) and during.fetched_bytes == 0
    job.deallocate(block)
    after = job.stats().memory
    assert after.in_use == 0 and after.peak == 3 << 20
