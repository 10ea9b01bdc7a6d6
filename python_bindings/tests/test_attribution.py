"""``with job:`` sets the thread's current job where Salus keeps it (C++ Runtime::JobScope), so
the raw allocation API, the C++ runtime and the PyTorch glue all see the same job."""
from __future__ import annotations

import threading

import pytest

import salus

MIB = 1 << 20


def _in_use(job: salus.Job) -> int:
    return job.stats().memory.in_use


def test_with_job_is_the_runtimes_current_job(runtime: salus.Runtime) -> None:
    a = runtime.add_job("a")
    b = runtime.add_job("b")
    assert runtime._impl.current_job() == 0
    with a:
        assert runtime._impl.current_job() == a.id
        with b:
            assert runtime._impl.current_job() == b.id
            ptr = runtime.allocate(MIB)  # no job named: the thread's
            assert (_in_use(a), _in_use(b)) == (0, MIB)
            runtime.deallocate(ptr)
        assert runtime._impl.current_job() == a.id
    assert runtime._impl.current_job() == 0
    ptr = runtime.allocate(MIB)
    assert (_in_use(a), _in_use(b)) == (0, 0)
    runtime.deallocate(ptr)


def test_an_error_inside_restores_the_previous_job(runtime: salus.Runtime) -> None:
    a = runtime.add_job("a")
    b = runtime.add_job("b")
    with a:
        with pytest.raises(RuntimeError, match="inside"):
            with b:
                raise RuntimeError("inside")
        assert runtime._impl.current_job() == a.id


def test_jobs_of_two_runtimes_nest_without_confusing_them() -> None:
    first = salus.Runtime("sim", memory="256MiB")
    second = salus.Runtime("sim", memory="256MiB")
    try:
        mine = first.add_job("mine")
        theirs = second.add_job("theirs")
        assert mine.id == theirs.id  # ids are per runtime
        with mine:
            with theirs:
                assert first._impl.current_job() == 0  # the innermost scope is the other's
                assert second._impl.current_job() == theirs.id
            assert first._impl.current_job() == mine.id
            assert second._impl.current_job() == 0
            ptr = second.allocate(MIB)
            assert _in_use(theirs) == 0
            second.deallocate(ptr)
    finally:
        first.close()
        second.close()


def test_each_thread_has_its_own_job(runtime: salus.Runtime) -> None:
    a = runtime.add_job("a")
    b = runtime.add_job("b")
    seen: list[int] = []

    def other() -> None:
        seen.append(runtime._impl.current_job())
        with b:
            seen.append(runtime._impl.current_job())

    with a:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert runtime._impl.current_job() == a.id
    assert seen == [0, b.id]


def test_a_job_that_left_refuses_allocations_inside_its_scope(runtime: salus.Runtime) -> None:
    a = runtime.add_job("a")
    with a:
        a.leave()
        with pytest.raises(salus.UnknownJob):
            runtime.allocate(MIB)
    assert runtime._impl.current_job() == 0
