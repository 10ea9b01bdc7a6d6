"""Bad input to every public entry point: a TypeError (wrong type) or salus.InvalidArgument (a
ValueError: wrong value) whose message names the argument, and nothing lost: the runtime works
afterwards. The classes of bad input: a bool where an int is expected, a negative value, a value
too large for the C++ type it goes to (int, uint32, uint64, size_t), NaN or infinity, a string
where a sequence is expected, a size whose digits overflow a float."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest

import salus

BIG = 1 << 64  # one past uint64_t and size_t
HUGE_SIZE = "1" * 400 + "GiB"  # float("1" * 400) is infinity


def sim(**kwargs: Any) -> salus.Runtime:
    return salus.Runtime("sim", **{"memory": "64MiB", **kwargs})


def job_of(rt: salus.Runtime, **kwargs: Any) -> salus.Job:
    return rt.add_job("bad", **kwargs)


# (id, call, exception, the argument its message must name)
BAD_INPUT: list[tuple[str, Callable[[salus.Runtime], Any], type, str]] = [
    # Runtime(...)
    ("devices past the cap", lambda rt: sim(devices=salus.MAX_SIM_DEVICES + 1),
     salus.InvalidArgument, "devices"),
    ("devices 2**64", lambda rt: sim(devices=BIG), salus.InvalidArgument, "devices"),
    ("devices bool", lambda rt: sim(devices=True), TypeError, "devices"),
    ("memory overflows a float", lambda rt: sim(memory=HUGE_SIZE), salus.InvalidArgument,
     "memory"),
    ("memory 2**64", lambda rt: sim(memory=BIG), salus.InvalidArgument, "memory"),
    ("memory bool", lambda rt: sim(memory=True), TypeError, "memory"),
    ("memory digits after the point", lambda rt: sim(memory="1." + "5" * 5000 + "GiB"),
     salus.InvalidArgument, "memory"),
    ("lend_reserve past the device", lambda rt: sim(lend_reserve="1GiB", devices=2,
                                                   spill="peer_then_host"),
     salus.InvalidArgument, "lend_reserve"),
    ("lend_reserve past a device limit", lambda rt: sim(lend_reserve="40MiB",
                                                       device_limits=["32MiB"]),
     salus.InvalidArgument, "lend_reserve"),
    ("lend_reserve 2**64", lambda rt: sim(lend_reserve=BIG), salus.InvalidArgument,
     "lend_reserve"),
    ("host_limit 2**64", lambda rt: sim(host_limit=BIG), salus.InvalidArgument, "host_limit"),
    ("host_limit negative", lambda rt: sim(host_limit=-1), salus.InvalidArgument, "host_limit"),
    ("device_limits a string", lambda rt: sim(device_limits="1GiB"), TypeError,
     "device_limits"),
    ("device_limits an int", lambda rt: sim(device_limits=5), TypeError, "device_limits"),
    ("device_limits 2**64", lambda rt: sim(device_limits=[BIG]), salus.InvalidArgument,
     "device_limits[0]"),
    # add_job(...)
    ("priority past int", lambda rt: job_of(rt, priority=1 << 31), salus.InvalidArgument,
     "priority"),
    ("priority below int", lambda rt: job_of(rt, priority=-(1 << 31) - 1),
     salus.InvalidArgument, "priority"),
    ("priority 2**64", lambda rt: job_of(rt, priority=BIG), salus.InvalidArgument, "priority"),
    ("priority bool", lambda rt: job_of(rt, priority=True), TypeError, "priority"),
    ("device 2**64", lambda rt: job_of(rt, device=BIG), salus.InvalidArgument, "device"),
    ("device negative", lambda rt: job_of(rt, device=-1), salus.InvalidArgument, "device"),
    ("expected_iterations 2**64", lambda rt: job_of(rt, expected_iterations=BIG),
     salus.InvalidArgument, "expected_iterations"),
    ("expected_iterations float", lambda rt: job_of(rt, expected_iterations=1.0), TypeError,
     "expected_iterations"),
    ("hint persistent 2**64", lambda rt: job_of(rt, hints={"persistent": BIG}),
     salus.InvalidArgument, "hints.persistent"),
    ("hint ephemeral overflows", lambda rt: job_of(rt, hints={"ephemeral_peak": HUGE_SIZE}),
     salus.InvalidArgument, "hints.ephemeral_peak"),
    ("hint seconds NaN", lambda rt: job_of(rt, hints={"iteration_seconds": math.nan}),
     salus.InvalidArgument, "hints.iteration_seconds"),
    ("hint seconds inf", lambda rt: job_of(rt, hints={"iteration_seconds": math.inf}),
     salus.InvalidArgument, "hints.iteration_seconds"),
    ("hint seconds negative", lambda rt: job_of(rt, hints={"iteration_seconds": -1.0}),
     salus.InvalidArgument, "hints.iteration_seconds"),
    ("hint seconds past a float", lambda rt: job_of(rt, hints={"iteration_seconds": 10**400}),
     salus.InvalidArgument, "hints.iteration_seconds"),
    ("hint seconds a string", lambda rt: job_of(rt, hints={"iteration_seconds": "1"}),
     TypeError, "hints.iteration_seconds"),
    ("limit 2**64", lambda rt: job_of(rt, limits={"total": BIG}), salus.InvalidArgument,
     "limits.total"),
    ("limit overflows", lambda rt: job_of(rt, limits={"ephemeral": HUGE_SIZE}),
     salus.InvalidArgument, "limits.ephemeral"),
    # allocate / deallocate
    ("allocate 2**64", lambda rt: rt.allocate(BIG), salus.InvalidArgument, "nbytes"),
    ("allocate bool", lambda rt: rt.allocate(True), TypeError, "nbytes"),
    ("allocate negative", lambda rt: rt.allocate(-1), salus.InvalidArgument, "nbytes"),
    ("allocate device 2**64", lambda rt: rt.allocate(4096, device=BIG), salus.InvalidArgument,
     "device"),
    ("allocate stream 2**64", lambda rt: rt.allocate(4096, stream=BIG), salus.InvalidArgument,
     "stream"),
    ("allocate stream negative", lambda rt: rt.allocate(4096, stream=-1),
     salus.InvalidArgument, "stream"),
    ("deallocate ptr 2**64", lambda rt: rt.deallocate(BIG), salus.InvalidArgument, "ptr"),
    ("deallocate nbytes 2**64", lambda rt: rt.deallocate(4096, BIG), salus.InvalidArgument,
     "nbytes"),
    ("deallocate device negative", lambda rt: rt.deallocate(4096, device=-1),
     salus.InvalidArgument, "device"),
    ("deallocate device past int", lambda rt: rt.deallocate(4096, device=1 << 40),
     salus.InvalidArgument, "device"),
    ("deallocate device bool", lambda rt: rt.deallocate(4096, device=False), TypeError,
     "device"),
    ("job allocate 2**64", lambda rt: job_of(rt).allocate(BIG), salus.InvalidArgument,
     "nbytes"),
    ("job deallocate 2**64", lambda rt: job_of(rt).deallocate(BIG), salus.InvalidArgument,
     "ptr"),
    # simulated kernels, streams, devices
    ("sim_kernel seconds inf", lambda rt: rt.sim_kernel(0, math.inf), salus.InvalidArgument,
     "seconds"),
    ("sim_kernel seconds past a float", lambda rt: rt.sim_kernel(0, 10**400),
     salus.InvalidArgument, "seconds"),
    ("sim_kernel seconds bool", lambda rt: rt.sim_kernel(0, True), TypeError, "seconds"),
    ("sim_kernel occupancy NaN", lambda rt: rt.sim_kernel(0, 0.01, math.nan),
     salus.InvalidArgument, "occupancy"),
    ("sim_kernel stream 2**64", lambda rt: rt.sim_kernel(BIG, 0.01), salus.InvalidArgument,
     "stream"),
    ("sim_kernel device past int", lambda rt: rt.sim_kernel(0, 0.01, device=1 << 40),
     salus.InvalidArgument, "device"),
    ("synchronize stream 2**64", lambda rt: rt.synchronize(BIG), salus.InvalidArgument,
     "stream"),
    ("device_stats past int", lambda rt: rt.device_stats(1 << 40), salus.InvalidArgument,
     "device"),
    ("device_activity past int", lambda rt: rt.device_activity(1 << 40), salus.InvalidArgument,
     "device"),
    # sizes anywhere, and the log level
    ("parse_size 2**64", lambda rt: salus.parse_size(BIG, "size"),
     salus.InvalidArgument, "size"),
    ("parse_size many digits", lambda rt: salus.parse_size("9" * 5000 + "B", "size"),
     salus.InvalidArgument, "size"),
    ("log level unknown", lambda rt: salus.set_log_level("verbose"), salus.InvalidArgument,
     "level"),
    ("log level not a string", lambda rt: salus.set_log_level(3), TypeError, "level"),
]


@pytest.mark.parametrize("call, error, names", [c[1:] for c in BAD_INPUT],
                         ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_refused_naming_the_argument(runtime: salus.Runtime,
                                                  call: Callable[[salus.Runtime], Any],
                                                  error: type, names: str) -> None:
    level = salus.log_level()
    with pytest.raises(error) as info:
        call(runtime)
    assert type(info.value) is not OverflowError
    assert names in str(info.value), f"the message does not name {names!r}: {info.value}"
    # Nothing was lost: nothing is held, the log level is as it was, and the runtime works.
    assert runtime.device_stats(0).allocated == 0
    assert salus.log_level() == level
    job = runtime.add_job("after")
    with job.iteration():
        job.deallocate(job.allocate(4096))
    job.leave()


def test_the_limits_themselves_are_accepted(runtime: salus.Runtime) -> None:
    """The edges of each range are not refused by mistake."""
    job = runtime.add_job("edges", priority=(1 << 31) - 1, expected_iterations=BIG - 1,
                          hints={"iteration_seconds": 0.0},
                          limits={"total": BIG - 1, "persistent": "1GiB"})
    assert job.stats().name == "edges"
    runtime.add_job("low", priority=-(1 << 31)).leave()
    job.leave()
    assert salus.parse_size("1.5GiB", "x") == 3 << 29
    assert salus.parse_size("16" + "0" * 18 + "B", "x") == 16 * 10**18
    assert salus.parse_size(BIG - 1, "x") == BIG - 1
    reserved = salus.Runtime("sim", memory="64MiB", lend_reserve="64MiB")
    reserved.close()
