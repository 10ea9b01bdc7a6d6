"""Runtime, Job and statistics: the Python face of the C++ runtime (module _salus)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Mapping, Optional, Sequence, Union

from . import _salus
from ._checks import (
    INT_MAX,
    INT_MIN,
    SIZE_MAX,
    UINT64_MAX,
    Size,
    check_int,
    check_items,
    check_number,
    check_str,
    parse_size,
)
from .errors import InvalidArgument
from . import _framework_hooks
from .policies import registered_policies


_UNLIMITED = SIZE_MAX
# Simulated GPUs one runtime holds at most (salus::kMaxSimDevices, SALUS_MAX_SIM_DEVICES in C).
MAX_SIM_DEVICES: int = _salus.MAX_SIM_DEVICES


def _check_device(value: Any, what: str = "device") -> int:
    """A device index: the runtime says whether that device exists."""
    return check_int(value, what, 0, INT_MAX)


def _check_address(value: Any, what: str) -> int:
    """A pointer or a native stream handle (uintptr_t)."""
    return check_int(value, what, 0, UINT64_MAX)


@dataclass(frozen=True)
class MemoryHints:
    """Starting points for the profiler; measured values replace them as iterations run."""

    persistent: Size = 0
    ephemeral_peak: Size = 0
    iteration_seconds: float = 0.0


@dataclass(frozen=True)
class JobLimits:
    """Byte budgets of one job (None: unlimited)."""

    total: Optional[Size] = None
    persistent: Optional[Size] = None
    ephemeral: Optional[Size] = None


@dataclass(frozen=True)
class ClassBytes:
    in_use: int
    peak: int
    blocks: int


@dataclass(frozen=True)
class JobMemory:
    """One job's memory, all devices: the fields of ``SALUS_JOB_MEMORY_STATS_FIELDS``
    (``salus/stats_fields.h`` describes each; ``salus._salus.job_memory_stats_fields()`` lists
    them), its live bytes by class, by device and by tier. ``tests/test_stats_fields.py`` checks
    that the two agree.
    """

    in_use: int  # live block bytes, both classes
    peak: int
    promoted_bytes: int  # ephemeral bytes that outlived an iteration
    quiescent: bool  # its pages may move between tiers now (the list's int, made a bool)
    activations: int  # safe points left: the job became active again
    activations_after_move: int  # ... after some of its pages had moved down a tier
    activations_waited: int  # ... that waited for pages to come home
    fetched_bytes: int  # brought home as it became active (it waited for them)
    prefetched_bytes: int  # brought home in the background
    persistent: ClassBytes
    ephemeral: ClassBytes
    in_use_by_device: list[int]
    in_use_by_tier: list[int]  # local GPU, peer GPU, host


@dataclass(frozen=True)
class JobStats:
    """One job: who it is, then the fields of ``SALUS_JOB_TURN_STATS_FIELDS`` and
    ``SALUS_JOB_PROFILE_FIELDS`` (``salus/stats_fields.h`` describes each;
    ``salus._salus.job_stats_fields()`` lists them), then its memory.
    ``tests/test_stats_fields.py`` checks that the two agree.
    """

    id: int
    name: str
    kind: str
    device: int
    lane: int
    state: str  # idle, waiting, running, left, cancelled
    iterations: int
    attained_seconds: float  # GPU time received
    waiting_seconds: float  # time blocked waiting for turns
    max_wait_seconds: float
    iteration_seconds: float  # profiled estimate of one iteration's GPU time
    persistent_bytes: int  # profiled
    ephemeral_peak_bytes: int  # profiled (last iteration's peak)
    memory: JobMemory = field(repr=False)


@dataclass(frozen=True)
class DeviceStats:
    """One device's memory: the fields of ``SALUS_DEVICE_STATS_FIELDS``
    (``salus/stats_fields.h`` describes each; ``salus._salus.device_stats_fields()`` lists
    them), and its live bytes by class. ``tests/test_stats_fields.py`` checks that the two agree.
    """

    device: int
    limit: int  # physical bytes Salus may hold
    granularity: int  # page size
    allocated: int  # live block bytes
    peak_allocated: int
    reserved: int  # physical pages held (mapped or pooled), in bytes
    peak_reserved: int
    mapped: int
    cached: int  # free bytes on mapped pages, ready for reuse
    allocations: int
    frees: int
    page_maps: int
    page_unmaps: int
    chunk_creates: int
    chunk_releases: int
    cross_stream_reuses: int
    out_of_memory: int
    lent: int  # this device's pages mapped into other devices' ranges
    borrowed_peer: int  # peers' pages mapped into this device's ranges
    borrowed_host: int  # host pages mapped into this device's ranges
    pages_moved: int
    bytes_moved: int
    move_seconds: float
    recalled_pages: int
    deferred_unmaps: int  # pages handed on behind queued work
    retiring: int  # bytes still mapped at such old addresses now
    allocation_waits: int
    stream_heaps: int
    persistent: ClassBytes
    ephemeral: ClassBytes


def _device_stats(raw: Mapping[str, Any]) -> DeviceStats:
    return DeviceStats(**{**raw, "persistent": ClassBytes(**raw["persistent"]),
                          "ephemeral": ClassBytes(**raw["ephemeral"])})


def _job_stats(raw: Mapping[str, Any]) -> JobStats:
    mem = dict(raw["memory"])
    mem["persistent"] = ClassBytes(**mem["persistent"])
    mem["ephemeral"] = ClassBytes(**mem["ephemeral"])
    mem["quiescent"] = bool(mem["quiescent"])
    return JobStats(**{**raw, "memory": JobMemory(**mem)})


class Runtime:
    """Jobs share each GPU at iteration granularity.

    ``backend``: "auto" (CUDA where a GPU is present, else simulated), "cuda" or "sim".
    ``devices``, ``memory`` and ``topology`` ("none", "nvlink_mesh", "two_islands", "pcie_only")
    describe the simulated GPUs. ``policy``: a built-in ("fifo", "srtf", "fair", "pack",
    "priority", "memory_aware") or one registered with :func:`salus.register_policy`.
    ``spill``: "none", "host_only" or "peer_then_host" (memory harvesting). ``device_limits``:
    bytes Salus may hold per device. ``contention``: how simulated kernels (:meth:`sim_kernel`)
    that run at once share a simulated GPU: "processor_sharing", "time_slicing" or "none".
    ``allocation_wait``: seconds an allocation the device refuses may wait for other jobs'
    iterations to end before it raises :class:`salus.OutOfMemory` (0: as long as one runs;
    None: the runtime's default, a minute).
    """

    def __init__(self, backend: str = "auto", *, devices: int = 1, memory: Size = "4GiB",
                 topology: str = "none", policy: str = "fair", spill: str = "none",
                 lend_reserve: Optional[Size] = None, host_limit: Optional[Size] = None,
                 device_limits: Optional[Sequence[Size]] = None,
                 contention: str = "processor_sharing",
                 allocation_wait: Optional[float] = None) -> None:
        check_str(backend, "backend")
        check_int(devices, "devices", 1, MAX_SIM_DEVICES)
        check_str(topology, "topology")
        check_str(spill, "spill")
        check_str(contention, "contention")
        wait = (None if allocation_wait is None
                else check_number(allocation_wait, "allocation_wait", 0.0))
        if not isinstance(policy, str):
            raise TypeError(f"policy must be a policy name, not {type(policy).__name__}")
        limits = [parse_size(v, f"device_limits[{i}]")
                  for i, v in enumerate(check_items(device_limits or [], "device_limits"))]
        reserve = None if lend_reserve is None else parse_size(lend_reserve, "lend_reserve")
        python_policies = list(registered_policies().items())
        self._impl = _salus.Runtime(
            backend=backend, devices=devices, memory=parse_size(memory, "memory"),
            topology=topology, policy=policy, spill=spill, lend_reserve=reserve,
            host_limit=None if host_limit is None else parse_size(host_limit, "host_limit"),
            device_limits=limits, python_policies=python_policies, contention=contention,
            allocation_wait=wait)
        self._jobs: list[Job] = []
        self._jobs_lock = threading.Lock()

    @classmethod
    def _wrap(cls, impl: Any) -> "Runtime":
        runtime = cls.__new__(cls)
        runtime._impl = impl
        runtime._jobs = []
        runtime._jobs_lock = threading.Lock()
        return runtime

    # --- life ---
    def close(self) -> None:
        """Leaves every job and frees everything (tensors Salus allocated stay valid until freed
        only while salus.torch holds the runtime)."""
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.leave()
        self._impl.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return bool(self._impl.closed)

    # --- facts ---
    @property
    def device_count(self) -> int:
        return int(self._impl.device_count)

    @property
    def backend_name(self) -> str:
        return str(self._impl.backend_name)

    @property
    def policy(self) -> str:
        return str(self._impl.policy)

    # --- jobs ---
    def add_job(self, name: str, *, kind: str = "training", priority: int = 0, device: int = 0,
                expected_iterations: int = 0,
                hints: Union[MemoryHints, Mapping[str, Any], None] = None,
                limits: Union[JobLimits, Mapping[str, Any], None] = None,
                blocks_outlive_job: bool = True) -> "Job":
        """Registers a job. With ``blocks_outlive_job`` (the default, as PyTorch needs), leaving
        or a cancel frees nothing that tensors still hold: those blocks stay valid, charged to
        nobody, until the tensors are freed, so no address is reused under a live tensor (nor
        under a thread still computing after a cancel)."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a job name must be a non-empty string, not {name!r}")
        check_str(kind, "job kind")
        check_int(priority, "priority", INT_MIN, INT_MAX)
        _check_device(device)
        check_int(expected_iterations, "expected_iterations", 0, UINT64_MAX)
        h = _coerce(hints, MemoryHints, "hints")
        lim = _coerce(limits, JobLimits, "limits")
        seconds = check_number(h.iteration_seconds, "hints.iteration_seconds", 0.0)

        def limit(v: Optional[Size], what: str) -> int:
            return _UNLIMITED if v is None else parse_size(v, what)

        raw = self._impl.add_job(
            name=name, kind=kind, priority=priority, device=device,
            expected_iterations=expected_iterations,
            hint_persistent=parse_size(h.persistent, "hints.persistent"),
            hint_ephemeral=parse_size(h.ephemeral_peak, "hints.ephemeral_peak"),
            hint_seconds=seconds,
            limit_total=limit(lim.total, "limits.total"),
            limit_persistent=limit(lim.persistent, "limits.persistent"),
            limit_ephemeral=limit(lim.ephemeral, "limits.ephemeral"),
            blocks_outlive_job=bool(blocks_outlive_job))
        job = Job(self, raw, device)
        with self._jobs_lock:
            self._jobs.append(job)
        return job

    # --- statistics and trace ---
    def job_stats(self) -> list[JobStats]:
        return [_job_stats(s) for s in self._impl.job_stats()]

    def device_stats(self, device: int = 0) -> DeviceStats:
        _check_device(device)
        return _device_stats(self._impl.device_stats(device))

    def trace_json(self) -> str:
        """Chrome trace-event JSON: iterations per lane and job, page moves, memory counters."""
        return str(self._impl.trace_json())

    def write_trace(self, path: Any) -> None:
        self._impl.write_trace(_path(path))

    def trim(self) -> int:
        """Gives cached pages back; returns the bytes released."""
        return int(self._impl.trim())

    # --- simulated GPUs ---
    def sim_kernel(self, stream: int, seconds: float, occupancy: float = 1.0,
                   device: int = 0) -> None:
        """Enqueues on ``stream`` (0: the device's default stream) a simulated kernel that takes
        ``seconds`` of GPU time alone and keeps ``occupancy`` (in (0, 1]) of the GPU busy.
        Kernels of streams that run at once share the GPU as the ``contention`` model says. Only
        on the sim backend (InvalidArgument elsewhere)."""
        _check_address(stream, "stream")
        _check_device(device)
        # The runtime checks the ranges (occupancy in (0, 1]) and names what was wrong.
        self._impl.sim_kernel(stream=stream, seconds=check_number(seconds, "seconds"),
                              occupancy=check_number(occupancy, "occupancy"), device=device)

    def synchronize(self, stream: int) -> None:
        """Blocks (without the GIL) until the work enqueued on ``stream`` so far has finished,
        as ``torch.cuda.Stream.synchronize`` does. ``stream`` 0 is device 0's default stream.
        A signal ends the wait (Ctrl-C raises ``KeyboardInterrupt`` at once); the work goes on."""
        _check_address(stream, "stream")
        self._impl.synchronize(stream=stream)

    def device_activity(self, device: int = 0) -> dict[str, float]:
        """What a simulated GPU's compute did so far: ``busy_seconds`` (time with a kernel
        running), ``utilization_seconds`` (busy share of the GPU integrated over time),
        ``work_seconds`` (seconds * occupancy of completed kernels) and ``kernels`` (completed
        ones). Only on the sim backend."""
        _check_device(device)
        return dict(self._impl.device_activity(device))

    # --- raw memory (tests, frameworks without salus.torch) ---
    def allocate(self, nbytes: Size, *, device: int = 0, stream: int = 0,
                 job: Optional["Job"] = None, lifetime: Optional[str] = None) -> int:
        """Device memory: returns its address. Attribution as Runtime::allocate in C++."""
        _check_device(device)
        _check_address(stream, "stream")
        if lifetime is not None:
            check_str(lifetime, "lifetime")
        return int(self._impl.allocate(bytes=parse_size(nbytes, "nbytes"), device=device,
                                       stream=stream, job=0 if job is None else job.id,
                                       lifetime=lifetime))

    def deallocate(self, ptr: int, nbytes: Size = 0, *, device: int = 0) -> None:
        _check_address(ptr, "ptr")
        _check_device(device)
        self._impl.deallocate(ptr=ptr, bytes=parse_size(nbytes, "nbytes"), device=device)

    def _capsule(self) -> Any:
        return self._impl._capsule()


def connect(path: Any = None) -> Runtime:
    """A runtime whose jobs take turns with the jobs of every process connected to the salusd at
    ``path`` (None: ``$SALUS_SOCKET``, else the per-user default), and whose GPU memory comes from
    it. Everything else works as on an in-process :class:`Runtime`. Raises :class:`DeviceError`
    when the daemon cannot be reached or refuses, and from any later call that needs it once it is
    gone."""
    return Runtime._wrap(_salus.connect("" if path is None else _path(path)))


def _path(path: Any) -> str:
    import os

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    return os.fspath(path)


def _coerce(value: Any, cls: type, what: str) -> Any:
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        try:
            return cls(**value)
        except TypeError as e:
            raise InvalidArgument(f"{what}: {e}") from None
    raise TypeError(f"{what} must be a {cls.__name__} or a dict, not {type(value).__name__}")


class _ThreadScopes(threading.local):
    """The calling thread's open ``with job:`` scopes, innermost last. Salus keeps the thread's
    current job (Runtime::JobScope in C++); this only holds the scopes until their ``__exit__``."""

    def __init__(self) -> None:
        self.stack: list[Any] = []


_scopes = _ThreadScopes()


def _bind(job: "Job") -> None:
    _scopes.stack.append(_salus.JobScope(job._runtime._impl, job.id, job.device))


def _unbind() -> None:
    _scopes.stack.pop().close()


class Iteration:
    """``with job.iteration() as it:``: waits for the job's turn (without the GIL), runs the
    body as the job's iteration, ends it. ``it.stream`` is the stream the work goes on.

    Ctrl-C while waiting raises ``KeyboardInterrupt`` at once, see :meth:`Job.begin_iteration`.
    """

    def __init__(self, job: "Job") -> None:
        self._job = job
        self.stream = 0

    def __enter__(self) -> "Iteration":
        _framework_hooks.current.user_iteration(self._job)
        self.stream = self._job.begin_iteration()
        try:
            _bind(self._job)
            try:
                # A failure the caller caught earlier is not ours.
                _framework_hooks.current.pending_error()
                _framework_hooks.current.enter_iteration(self)
            except BaseException:
                _unbind()
                raise
        except BaseException:
            # No __exit__ follows a failed __enter__ (a Ctrl-C landing here, say): the turn
            # must not stay taken, or the job would hold its lane for ever.
            try:
                self._job.end_iteration()
            except Exception:
                pass  # cancelled meanwhile: nothing to end, and the first error says more
            raise
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            _framework_hooks.current.exit_iteration(self)
        finally:
            _unbind()
        pending = _framework_hooks.current.pending_error() if exc is not None else None
        try:
            self._job.end_iteration()
        except Exception:
            if exc is None:
                raise
            # The body's error says more (often a cancel the end repeats).
        if pending is not None:
            # Raised from this frame, the error would be held in its locals, which its own
            # traceback reaches: a cycle that kept the failed iteration's frames, and so its
            # tensors, until Python's cyclic collector ran (a job that failed for lack of memory
            # kept that memory from the others for seconds or more).
            try:
                raise pending from exc
            finally:
                del pending, exc, tb


class Job:
    """A registered job. ``with job.iteration():`` brackets each iteration; ``with job:`` makes
    the calling thread work for the job outside iterations (persistent memory)."""

    def __init__(self, runtime: Runtime, impl: Any, device: int) -> None:
        self._runtime = runtime
        self._impl = impl
        self.device = device
        self.id = int(impl.id)
        self.name = str(impl.name)
        # The running iteration's stream; None outside an iteration. Only the thread that runs
        # the job's iterations sets it.
        self._iteration_stream: Optional[int] = None

    def __repr__(self) -> str:
        return f"salus.Job(id={self.id}, name={self.name!r})"

    def iteration(self) -> Iteration:
        return Iteration(self)

    def begin_iteration(self) -> int:
        """Waits (without the GIL) for the job's turn; returns the stream its work goes on.

        A signal ends the wait: Ctrl-C raises ``KeyboardInterrupt`` within a twentieth of a
        second. The wait is then withdrawn, not the job: it is idle, queued nowhere, holds no turn
        (one granted meanwhile goes back unused) and keeps its memory, so it may ask for a turn
        again. Only the main thread runs signal handlers; a wait in another thread goes on (use
        :meth:`cancel` to end it from outside). Raises :class:`JobCancelled` when the job is
        cancelled while it waits.
        """
        stream = int(self._impl.begin_iteration())
        self._iteration_stream = stream
        return stream

    def end_iteration(self) -> None:
        try:
            self._impl.end_iteration()
        finally:
            self._iteration_stream = None

    def sim_kernel(self, seconds: float, occupancy: float = 1.0) -> None:
        """A simulated kernel (see :meth:`Runtime.sim_kernel`) on the running iteration's
        stream: it counts as this job's GPU time. Only inside an iteration."""
        stream = self._iteration_stream
        if stream is None:
            raise InvalidArgument(f"sim_kernel: job '{self.name}' is not inside an iteration")
        self._runtime.sim_kernel(stream, seconds, occupancy, device=self.device)

    def synchronize(self) -> None:
        """Waits until the work this job enqueued on its stream (the running iteration's, else its
        lane's) has finished: reading a result at the end of an iteration does this, and it keeps
        the host from running ahead of the GPU. Its GPU time is charged once the stream is past
        the iteration's end. A no-op before the job's first iteration. Ctrl-C ends the wait (the
        work goes on), as for :meth:`Runtime.synchronize`."""
        stream = self._iteration_stream
        if stream is None:
            stream = self.stream
        if stream:
            self._runtime.synchronize(stream)

    def cancel(self) -> None:
        """From any thread: the job stops; a wait for its turn raises JobCancelled."""
        self._impl.cancel()

    def leave(self) -> None:
        """The job is done: frees what it holds. Idempotent."""
        self._impl.leave()

    def stats(self) -> JobStats:
        return _job_stats(self._impl.stats())

    @property
    def stream(self) -> int:
        return int(self._impl.stream)

    def allocate(self, nbytes: Size, lifetime: Optional[str] = None) -> int:
        if lifetime is not None:
            check_str(lifetime, "lifetime")
        return int(self._impl.allocate(parse_size(nbytes, "nbytes"), lifetime))

    def deallocate(self, ptr: int) -> None:
        _check_address(ptr, "ptr")
        self._impl.deallocate(ptr)

    def __enter__(self) -> "Job":
        _bind(self)
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        _unbind()
        pending = _framework_hooks.current.pending_error() if exc is not None else None
        if pending is not None:
            try:
                raise pending from exc
            finally:
                del pending, exc, tb  # no cycle through this frame (see Iteration.__exit__)


_default: Optional[Runtime] = None
_default_lock = threading.Lock()


def _forget_default_in_child() -> None:
    """A forked child starts without a default runtime, as the C++ side does: the parent's is
    the parent's (every call on it raises NotSupported here, and it is never destroyed here), and
    the next :func:`default_runtime` makes a new one. The lock is new: a thread of the parent
    may have held it, and that thread is not in the child."""
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_default_in_child)


def default_runtime() -> Runtime:
    """The process's default runtime: the same one as the C ABI's ``salus_default_runtime()``
    and C++ ``salus::Runtime::default_runtime()`` (made on first use: CUDA where a GPU is
    present, else one simulated GPU; policy "fair"). In a forked child it is a new one, made
    on first use there."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Runtime._wrap(_salus.default_runtime())
        return _default
