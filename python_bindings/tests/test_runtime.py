"""The salus module without PyTorch: runtimes, jobs, errors with fields, Python policies."""

from __future__ import annotations

import json
import pickle
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import salus


def test_a_job_iterates_and_reports_plain_statistics(runtime: salus.Runtime) -> None:
    job = runtime.add_job("a", expected_iterations=3)
    for _ in range(3):
        with job.iteration() as it:
            assert it.stream != 0
            block = job.allocate("1MiB")
            job.deallocate(block)
    stats = job.stats()
    assert isinstance(stats, salus.JobStats)
    assert (stats.name, stats.kind, stats.state, stats.iterations) == ("a", "training", "idle", 3)
    assert stats.memory.ephemeral.peak >= 1 << 20
    assert runtime.device_stats(0).allocated == 0
    assert [s.name for s in runtime.job_stats()] == ["a"]
    job.leave()
    assert job.stats().state == "left"


def test_jobs_in_threads_take_turns_because_the_wait_releases_the_gil(
        runtime: salus.Runtime) -> None:
    inside = 0
    most = 0
    lock = threading.Lock()

    def loop(job: salus.Job) -> None:
        nonlocal inside, most
        for _ in range(5):
            with job.iteration():
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.002)  # the other thread waits in begin_iteration meanwhile
                with lock:
                    inside -= 1

    jobs = [runtime.add_job(f"j{i}") for i in range(3)]
    threads = [threading.Thread(target=loop, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a thread is stuck (GIL held while waiting?)"
    assert most == 1, "fair runs one iteration at a time on one lane"
    assert all(j.stats().iterations == 5 for j in jobs)


def test_a_cancelled_waiter_raises_job_cancelled(runtime: salus.Runtime) -> None:
    holder, waiter = runtime.add_job("holder"), runtime.add_job("waiter")
    errors: list[BaseException] = []
    holder.begin_iteration()

    def wait() -> None:
        try:
            with waiter.iteration():
                pass
        except BaseException as e:  # noqa: BLE001 (the test inspects it)
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.monotonic() + 10
    while waiter.stats().state != "waiting" and time.monotonic() < deadline:
        time.sleep(0.001)
    waiter.cancel()
    t.join(timeout=10)
    holder.end_iteration()
    assert len(errors) == 1 and isinstance(errors[0], salus.JobCancelled)
    assert "waiter" in str(errors[0])
    with pytest.raises(salus.JobCancelled):
        waiter.begin_iteration()


def test_out_of_memory_carries_its_fields_and_pickles(runtime: salus.Runtime) -> None:
    job = runtime.add_job("greedy", limits={"total": "4MiB"})
    with pytest.raises(salus.OutOfMemory) as info:
        job.allocate("8MiB")
    e = info.value
    assert isinstance(e, MemoryError) and isinstance(e, salus.Error)
    assert (e.job, e.job_name, e.device) == (job.id, "greedy", 0)
    assert e.requested == 8 << 20 and e.job_limit == 4 << 20 and e.job_in_use == 0
    assert e.device_limit == 1 << 30
    assert e.reason
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is salus.OutOfMemory and again.job_name == "greedy"
    # Nothing leaked, the job goes on within its limit.
    assert runtime.device_stats(0).allocated == 0
    job.deallocate(job.allocate("2MiB"))


def test_device_out_of_memory_names_the_device(runtime: salus.Runtime) -> None:
    job = runtime.add_job("big")
    first = job.allocate("600MiB")
    with pytest.raises(salus.OutOfMemory) as info:
        job.allocate("600MiB")
    assert info.value.job_limit == 0 and info.value.device_limit == 1 << 30
    assert info.value.job_in_use == 600 << 20 and info.value.device == 0
    assert info.value.waited == 0.0  # no other iteration to wait for: it failed at once
    job.deallocate(first)
    # A request no device could ever hold is out of memory, as PyTorch's allocator says.
    with pytest.raises(salus.OutOfMemory, match="never fit") as info:
        job.allocate("2GiB")
    assert info.value.requested == 2 << 30 and info.value.device_limit == 1 << 30


def test_an_allocation_waits_for_another_threads_iteration_at_most_allocation_wait() -> None:
    """The wait for memory another job's iteration holds ends with OutOfMemory at the limit."""
    rt = salus.Runtime("sim", memory="64MiB", policy="pack", allocation_wait=0.2)
    try:
        a = rt.add_job("a", hints={"persistent": "1MiB", "ephemeral_peak": "2MiB"})
        b = rt.add_job("b", hints={"persistent": "1MiB", "ephemeral_peak": "2MiB"})
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with a.iteration():
                ptr = a.allocate("48MiB")
                holding.set()
                release.wait(30)
                a.deallocate(ptr)

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(30)
        start = time.monotonic()
        with pytest.raises(salus.OutOfMemory) as info:
            b.allocate("32MiB")
        waited = time.monotonic() - start
        release.set()
        holder.join()
        assert 0.2 <= waited < 5.0, waited
        assert info.value.job == b.id and info.value.requested == 32 << 20
        assert 0.2 <= info.value.waited <= waited  # the error says it waited, and how long
        b.deallocate(b.allocate("32MiB"))  # a's iteration freed it: b goes on
    finally:
        rt.close()


@pytest.mark.parametrize("value, error", [(-1, salus.InvalidArgument),
                                          (float("nan"), salus.InvalidArgument),
                                          ("1s", TypeError)])
def test_a_bad_allocation_wait_is_refused_by_name(value: object, error: type) -> None:
    with pytest.raises(error, match="allocation_wait"):
        salus.Runtime("sim", memory="64MiB", allocation_wait=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("memory, says", [("191MiB", "memory=191MiB: .* pages of 2MiB; say 190MiB or 192MiB"),
                                          ("1GB", "memory=1000000000B: .* say 952MiB or 954MiB"),
                                          (1000, "memory=1000B: .* say 2MiB$")])
def test_a_simulated_gpu_of_part_pages_is_refused_naming_the_argument(memory: object,
                                                                      says: str) -> None:
    """Before, the refusal was in bytes and named neither the argument nor what would do
    (issue 34, item 9)."""
    with pytest.raises(salus.InvalidArgument, match=says):
        salus.Runtime("sim", memory=memory)  # type: ignore[arg-type]


def test_trace_shows_iterations(runtime: salus.Runtime, tmp_path: Path) -> None:
    job = runtime.add_job("traced")
    with job.iteration():
        pass
    path = tmp_path / "trace.json"
    runtime.write_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("cat") == "iteration" and e["name"] == "traced" for e in events)


class NewestFirst(salus.Policy):
    """Serves the job that arrived last first: the opposite of fifo."""

    name = "newest_first"

    def key(self, job: salus.JobView) -> tuple[float, float]:
        return (-float(job.arrival), 0.0)


def test_a_policy_written_in_python_orders_the_waiters() -> None:
    salus.register_policy("newest_first", NewestFirst)
    try:
        rt = salus.Runtime("sim", memory="256MiB", policy="newest_first")
        assert rt.policy == "newest_first"
        holder = rt.add_job("holder")
        waiters = [rt.add_job(f"w{i}") for i in range(3)]
        order: list[str] = []
        holder.begin_iteration()

        def run(job: salus.Job) -> None:
            with job.iteration():
                order.append(job.name)

        threads = []
        for job in waiters:  # they start waiting in arrival order
            t = threading.Thread(target=run, args=(job,))
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 10
            while job.stats().state != "waiting" and time.monotonic() < deadline:
                time.sleep(0.001)
        holder.end_iteration()
        for t in threads:
            t.join(timeout=10)
        assert order == ["w2", "w1", "w0"]
        rt.close()
    finally:
        salus.unregister_policy("newest_first")


def test_python_policy_errors() -> None:
    with pytest.raises(ValueError, match="taken"):
        salus.register_policy("fair", NewestFirst)
    with pytest.raises(ValueError):
        salus.register_policy("", NewestFirst)
    with pytest.raises(TypeError):
        salus.register_policy("x", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        salus.unregister_policy("never_registered")

    class MemoryAware(NewestFirst):
        lanes = "memory_aware"

    salus.register_policy("bad_lanes", MemoryAware)
    try:
        with pytest.raises(salus.InvalidArgument, match="single"):
            salus.Runtime("sim", memory="64MiB", policy="bad_lanes")
    finally:
        salus.unregister_policy("bad_lanes")


BAD_CALLS: list[tuple[str, Callable[[salus.Runtime], Any], type]] = [
    ("unknown backend", lambda rt: salus.Runtime("tpu"), ValueError),
    ("devices 0", lambda rt: salus.Runtime("sim", devices=0), ValueError),
    ("devices not int", lambda rt: salus.Runtime("sim", devices="2"), TypeError),
    ("memory words", lambda rt: salus.Runtime("sim", memory="lots"), ValueError),
    ("memory float", lambda rt: salus.Runtime("sim", memory=1.5), TypeError),
    ("memory negative", lambda rt: salus.Runtime("sim", memory=-1), ValueError),
    ("unknown topology", lambda rt: salus.Runtime("sim", topology="ring"), ValueError),
    ("odd islands", lambda rt: salus.Runtime("sim", devices=3, topology="two_islands"),
     ValueError),
    ("unknown spill", lambda rt: salus.Runtime("sim", spill="disk"), ValueError),
    ("unknown policy", lambda rt: salus.Runtime("sim", policy="lottery"), ValueError),
    ("policy not str", lambda rt: salus.Runtime("sim", policy=3), TypeError),
    ("device_limits", lambda rt: salus.Runtime("sim", device_limits=["x"]), ValueError),
    ("empty job name", lambda rt: rt.add_job(""), ValueError),
    ("job name not str", lambda rt: rt.add_job(7), ValueError),
    ("unknown kind", lambda rt: rt.add_job("a", kind="batch"), ValueError),
    ("priority str", lambda rt: rt.add_job("a", priority="high"), TypeError),
    ("device missing", lambda rt: rt.add_job("a", device=3), ValueError),
    ("negative iterations", lambda rt: rt.add_job("a", expected_iterations=-1), ValueError),
    ("hints field", lambda rt: rt.add_job("a", hints={"bogus": 1}), ValueError),
    ("hints type", lambda rt: rt.add_job("a", hints=5), TypeError),
    ("limits type", lambda rt: rt.add_job("a", limits=5), TypeError),
    ("limit size", lambda rt: rt.add_job("a", limits={"total": "much"}), ValueError),
    ("device_stats device", lambda rt: rt.device_stats(9), ValueError),
    ("device_stats type", lambda rt: rt.device_stats("0"), TypeError),
    ("write_trace path", lambda rt: rt.write_trace(123), TypeError),
    ("allocate size", lambda rt: rt.allocate("x"), ValueError),
    ("allocate zero", lambda rt: rt.allocate(0), ValueError),
    ("allocate device", lambda rt: rt.allocate(1024, device=4), ValueError),
    ("allocate lifetime", lambda rt: rt.allocate(1024, lifetime="forever"), ValueError),
    ("deallocate unknown", lambda rt: rt.deallocate(0x1234), ValueError),
    ("deallocate type", lambda rt: rt.deallocate("p"), TypeError),
    ("end outside", lambda rt: rt.add_job("e").end_iteration(), ValueError),
    ("job deallocate unknown", lambda rt: rt.add_job("d").deallocate(4096), ValueError),
    ("job allocate lifetime", lambda rt: rt.add_job("l").allocate(10, "x"), ValueError),
]


@pytest.mark.parametrize("what,call,error", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_clear_python_errors(runtime: salus.Runtime, what: str,
                                                 call: Callable[[salus.Runtime], Any],
                                                 error: type) -> None:
    with pytest.raises(error) as info:
        call(runtime)
    assert str(info.value), f"{what}: the error says nothing"
    # Nothing was lost: the runtime still works.
    job = runtime.add_job(f"after {what}")
    with job.iteration():
        job.deallocate(job.allocate(4096))
    job.leave()


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(salus.InvalidArgument, match="fair"):
        salus.Runtime("sim", policy="lottery")


def test_closed_runtime_refuses_clearly() -> None:
    rt = salus.Runtime("sim", memory="64MiB")
    rt.close()
    assert rt.closed
    with pytest.raises(salus.InvalidArgument, match="closed"):
        rt.add_job("late")


def test_cuda_backend_without_a_gpu_is_not_supported() -> None:
    if salus.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(salus.NotSupported):
        salus.Runtime("cuda")
    assert salus.Runtime("auto", memory="64MiB").backend_name == "sim"


def test_sizes_parse() -> None:
    assert salus.parse_size("4GiB", "x") == 4 << 30
    assert salus.parse_size("512 MiB", "x") == 512 << 20
    assert salus.parse_size(123, "x") == 123
    assert salus.parse_size("1.5KiB", "x") == 1536


def test_the_default_runtime_is_the_c_abis() -> None:
    import ctypes

    rt = salus.default_runtime()
    assert salus.default_runtime() is rt
    libs = sorted((Path(salus.__file__).parent).glob("libsalus.so*"))
    assert libs, "libsalus is not in the package"
    lib = ctypes.CDLL(str(libs[0]))
    lib.salus_malloc.restype = ctypes.c_void_p
    lib.salus_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.salus_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    before = rt.device_stats(0).allocated
    ptr = lib.salus_malloc(3 << 20, 0, None)  # the C ABI's hook, on its default runtime
    assert ptr
    assert rt.device_stats(0).allocated == before + (3 << 20)
    lib.salus_free(ptr, 3 << 20, 0, None)
    assert rt.device_stats(0).allocated == before


def test_sim_kernels_count_as_the_jobs_gpu_time_and_share_the_gpu() -> None:
    with salus.Runtime("sim", memory="256MiB", policy="pack") as rt:
        job = rt.add_job("k", expected_iterations=2)
        for _ in range(2):
            with job.iteration() as it:
                job.sim_kernel(0.03, occupancy=0.5)
                time.sleep(0.02)  # host work: not GPU time
                rt.sim_kernel(it.stream, 0.02, 0.5)
        # GPU time is known once the GPU got through the work: until then it is not charged.
        deadline = time.monotonic() + 10
        while (stats := job.stats()).attained_seconds < 0.09 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stats.attained_seconds == pytest.approx(0.1, rel=0.05)
        assert stats.iteration_seconds == pytest.approx(0.05, rel=0.05)
        activity = rt.device_activity(0)
        assert set(activity) == {"busy_seconds", "utilization_seconds", "work_seconds", "kernels"}
        assert activity["kernels"] == 4
        assert activity["work_seconds"] == pytest.approx(0.05, rel=1e-6)
        assert activity["utilization_seconds"] == pytest.approx(0.05, rel=0.02)


def test_job_synchronize_waits_for_its_kernels_and_settles_its_gpu_time() -> None:
    with salus.Runtime("sim", memory="256MiB") as rt:
        job = rt.add_job("s")
        job.synchronize()  # before any iteration: nothing to wait for
        start = time.monotonic()
        with job.iteration():
            job.sim_kernel(0.05)
            job.synchronize()  # inside: the iteration's stream
            assert time.monotonic() - start >= 0.049
        job.synchronize()  # after: past the iteration's end marker, so it is charged
        assert job.stats().attained_seconds == pytest.approx(0.05, rel=0.05)
        with pytest.raises(salus.errors.InvalidArgument):
            rt.synchronize(12345)  # no such stream


def test_contention_is_chosen_by_name() -> None:
    def busy_seconds_of_two_kernels_at_once(contention: str) -> float:
        with salus.Runtime("sim", memory="256MiB", contention=contention) as rt:
            job = rt.add_job("j")
            with job.iteration():
                job.sim_kernel(0.05)  # on the job's lane stream...
                rt.sim_kernel(0, 0.05)  # ...and on the default stream, at the same time
            deadline = time.monotonic() + 10
            while rt.device_activity()["kernels"] < 2:
                assert time.monotonic() < deadline, "the kernels never finished"
                time.sleep(0.005)
            return float(rt.device_activity()["busy_seconds"])

    # Without contention both run at full speed; shared, the GPU needs twice as long.
    assert busy_seconds_of_two_kernels_at_once("none") == pytest.approx(0.05, rel=0.3)
    assert busy_seconds_of_two_kernels_at_once("processor_sharing") == pytest.approx(0.1, rel=0.05)
    with pytest.raises(salus.InvalidArgument, match="processor_sharing"):
        salus.Runtime("sim", memory="256MiB", contention="bogus")


@pytest.mark.parametrize("call, match", [
    (lambda rt: rt.sim_kernel(0, -1.0), "seconds"),
    (lambda rt: rt.sim_kernel(0, float("nan")), "seconds"),
    (lambda rt: rt.sim_kernel(0, 0.01, occupancy=0.0), "occupancy"),
    (lambda rt: rt.sim_kernel(0, 0.01, occupancy=1.5), "occupancy"),
    (lambda rt: rt.sim_kernel(0, 0.01, device=3), "device 3"),
    (lambda rt: rt.sim_kernel(12345, 0.01), "12345|0x3039"),
    (lambda rt: rt.device_activity(7), "device 7"),
])
def test_bad_sim_kernel_input_raises_invalid_argument(runtime: salus.Runtime,
                                                       call: Callable[[salus.Runtime], Any],
                                                       match: str) -> None:
    with pytest.raises(salus.errors.InvalidArgument, match=match):
        call(runtime)


def test_job_sim_kernel_outside_an_iteration_is_an_error(runtime: salus.Runtime) -> None:
    job = runtime.add_job("idle")
    with pytest.raises(salus.errors.InvalidArgument, match="not inside an iteration"):
        job.sim_kernel(0.01)
    with job.iteration():
        job.sim_kernel(0.0)
    with pytest.raises(salus.errors.InvalidArgument, match="not inside an iteration"):
        job.sim_kernel(0.01)
    with pytest.raises(TypeError):
        runtime.sim_kernel(0, "1s")  # type: ignore[arg-type]


def test_the_core_calls_the_installed_framework_hooks_in_order(runtime: salus.Runtime) -> None:
    from salus import _framework_hooks

    calls: list[str] = []

    class Recording(_framework_hooks.FrameworkHooks):
        def user_iteration(self, job: salus.Job) -> None:
            calls.append(f"user {job.name}")

        def enter_iteration(self, it: salus.Iteration) -> None:
            assert it.stream != 0  # inside the turn
            calls.append("enter")

        def exit_iteration(self, it: salus.Iteration) -> None:
            calls.append("exit")

        def pending_error(self) -> BaseException | None:
            calls.append("pending")
            return None

    before = _framework_hooks.current
    _framework_hooks.install(Recording())
    try:
        job = runtime.add_job("hooked")
        with job.iteration():
            calls.append("body")
        with pytest.raises(ValueError):
            with job.iteration():
                raise ValueError("the body's own")
    finally:
        _framework_hooks.install(before)
    # A body that raised asks for the framework's pending error; one that ended cleanly does not.
    assert calls == ["user hooked", "pending", "enter", "body", "exit",
                     "user hooked", "pending", "enter", "exit", "pending"]


def test_the_core_imports_no_framework_glue_bench_or_ray_at_module_level() -> None:
    import ast

    package = Path(salus.__file__).parent
    glue = {"torch", "bench", "ray"}
    for module in sorted(package.glob("*.py")):
        if module.name in ("__init__.py", "torch.py"):
            continue  # the package's front door, and the glue itself
        for node in ast.parse(module.read_text()).body:  # module level only
            names: set[str] = set()
            if isinstance(node, ast.ImportFrom) and node.level > 0:  # from .x import / from . import x
                names = ({node.module.split(".")[0]} if node.module
                         else {a.name for a in node.names})
            elif isinstance(node, ast.ImportFrom) and node.module == "salus":
                names = {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("salus."):
                names = {node.module.split(".")[1]}
            elif isinstance(node, ast.Import):
                names = {a.name.split(".")[1] for a in node.names if a.name.startswith("salus.")}
            assert not names & glue, f"{module.name} imports {names & glue} at module level"


def test_the_optional_parts_name_their_extra_when_what_they_need_is_missing() -> None:
    """salus.ray and salus-bench's ray mode, where Ray is not importable: an ImportError and a
    ModeNotSupported that name the extra to install (pip install 'salus[ray]'), and the core
    still imports and runs (issue 35: the core never depends on its integrations)."""
    import subprocess
    import sys

    probe = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed: `import ray` raises ImportError
import salus
rt = salus.Runtime("sim", memory="64MiB")
job = rt.add_job("core")
with job.iteration():
    job.allocate(1 << 20)
rt.close()
try:
    import salus.ray
except ImportError as e:
    print("ray:", e.name, "|", e)
from salus.bench import ModeNotSupported, run
try:
    run("ray_trials", "ray", out=sys.argv[1], scale="small")
except ModeNotSupported as e:
    print("bench:", e)
"""
    import tempfile
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", probe, out], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(l.startswith("ray: ray |") and "pip install 'salus[ray]'" in l for l in lines), lines
    assert any(l.startswith("bench:") and "salus[ray]" in l for l in lines), lines
