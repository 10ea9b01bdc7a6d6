"""``ray`` mode: the same trials three ways on a local Ray cluster of simulated GPUs.

1. **one per GPU**: a salus.ray SalusCluster that admits one trial per GPU at a time (what Ray
   Tune does with ``num_gpus=1`` per trial).
2. **Ray fractional GPUs**: plain Ray tasks with ``num_gpus=fraction``. Ray packs ``1/fraction``
   of them on a GPU with no look at memory. Each task runs its trial on its GPU's simulated
   device (a :class:`SimGpu` actor) as a process of its own would: its own CUDA context, no
   scheduling, no limits; a trial whose allocation does not fit fails with OutOfMemory (Ray
   Tune would mark it errored) and is not retried.
3. **Salus on Ray**: a SalusCluster whose placer admits trials by Salus's rule (persistent
   memory plus the largest ephemeral peak fits the GPU) and whose workers share each GPU at
   iteration granularity under a Salus policy.
4. **Salus on Ray, trial processes** (``[ray] trial_processes = true``): the same placer, each
   trial in a Ray actor process of its own, a process of a salusd the cluster starts
   (``SalusCluster(processes=True)``).

Every arm runs the same trials (the experiment's jobs, coarsened to ``max_steps`` iterations,
time and memory scaled as in run mode): per iteration a trial holds its ephemeral bytes while a
simulated kernel of its iteration time runs at its occupancy. Ray is imported only here, when
the mode runs.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import salus

from ..errors import Error
from ..policies import BUILTIN_POLICIES
from .errors import InputError, ModeNotSupported
from .experiment import Experiment, Variant
from .jobs import JobSet, JobSpec
from .live import PAGE, scaled_for_run
from .results import DeviceResult, JobResult, VariantResult

MiB = 1 << 20
ONE_PER_GPU = "one-per-GPU"
# Variant.group says which arm a variant is.
_ONE, _FRACTIONAL, _SALUS, _PROCESSES = "baseline", "ray-fractional", "compare", "processes"
_DEFAULTS = {"fraction": 0.25, "context_memory": 500 * MiB, "time_scale": 0.05,
             "memory_scale": 1 / 16, "max_steps": 10, "limit_minus_context": True,
             "weights_in_first_iteration": True, "trial_processes": False}


@dataclass(frozen=True)
class RaySettings:
    """The ``[ray]`` table with its defaults; sizes are bytes of the simulated GPUs (scaled)."""

    gpus: int
    gpu_memory: int
    fraction: float
    context: int
    context_unscaled: int
    time_scale: float
    memory_scale: float
    max_steps: int
    contention: str
    limit_minus_context: bool
    weights_in_first_iteration: bool
    trial_processes: bool

    @classmethod
    def of(cls, exp: Experiment) -> "RaySettings":
        cfg = {**_DEFAULTS, **exp.section("ray")}
        cluster = exp.data["cluster"]
        gpus = int(cluster.get("machines", 1)) * int(cluster.get("gpus_per_machine", 1))
        scale = float(cfg["memory_scale"])
        memory = max(PAGE * 4, math.ceil(exp.gpu_memory * scale / PAGE) * PAGE)
        context = int(cfg["context_memory"])
        return cls(gpus, memory, float(cfg["fraction"]), math.ceil(context * scale / MiB) * MiB,
                   context, float(cfg["time_scale"]), scale, int(cfg["max_steps"]),
                   exp.contention, bool(cfg["limit_minus_context"]),
                   bool(cfg["weights_in_first_iteration"]), bool(cfg["trial_processes"]))

    @property
    def per_gpu(self) -> int:
        """Fractional tasks Ray runs at once on one GPU."""
        return max(1, math.floor(1.0 / self.fraction + 1e-9))


@dataclass(frozen=True)
class TrialPlan:
    """One trial as every arm runs it: real seconds and bytes of the simulated GPU."""

    name: str
    steps: int
    step_seconds: float
    occupancy: float
    persistent: int
    ephemeral: int
    weights_in_first_iteration: bool = True  # else when it starts (see salus_trial)


@dataclass(frozen=True)
class TrialRecord:
    """What a trial did. Times are ``time.time()``: one clock for every process of the local
    cluster."""

    name: str
    gpu: int
    start: float
    finish: float
    steps: int
    error: str = ""


# --- the arms -------------------------------------------------------------------------------

def ray_arms(exp: Experiment, policies: Optional[list[str]] = None) -> list[Variant]:
    """One per GPU (the baseline), Ray fractional, then Salus on Ray for each policy (the
    experiment's ``[compare] policies`` or ``--policies``)."""
    s = RaySettings.of(exp)
    chosen = policies if policies is not None else list(exp.data["compare"]["policies"])
    for policy in chosen:
        if policy not in BUILTIN_POLICIES:
            reason = (f"{policy!r} is not a built-in policy: Ray's worker processes know only "
                      f"those ({', '.join(BUILTIN_POLICIES)})")
            if policies is not None:
                raise InputError("<command line>", None, "--policies", reason)
            raise exp.error(("compare", "policies"), reason)
    arms = [Variant(ONE_PER_GPU, "fifo", "1 trial per GPU", 1, s.gpus, group=_ONE),
            Variant(f"Ray fractional {s.fraction:g}", "none (time-sliced)",
                    f"Ray num_gpus={s.fraction:g}", 1, s.gpus, group=_FRACTIONAL)]
    arms += [Variant(f"Salus on Ray ({p})", p, "Salus admission rule", 1, s.gpus, group=_SALUS)
             for p in chosen]
    if s.trial_processes:
        arms += [Variant(f"Salus on Ray, trial processes ({p})", p, "Salus admission rule", 1,
                         s.gpus, group=_PROCESSES) for p in chosen]
    return arms


def check_ray(exp: Experiment) -> None:
    """ModeNotSupported, before any output, when Ray cannot be imported."""
    try:
        import ray  # noqa: F401

        import salus.ray  # noqa: F401
    except ImportError as e:
        raise ModeNotSupported(exp.name, "ray", f"Ray is not importable ({e}); install it "
                               "with pip install 'salus[ray]'") from None


def ray_variants(exp: Experiment, jobset: JobSet, variants: list[Variant],
                 progress: Callable[[str], None]) -> tuple[list[VariantResult], list[str]]:
    import ray

    s = RaySettings.of(exp)
    specs = scaled_for_run(jobset.jobs, s.max_steps)
    plans = [plan_for(spec, s) for spec in specs]
    started = _start_ray(ray, exp, s)
    results = []
    try:
        for variant in variants:
            progress(variant.label)
            arm = {_ONE: _one_per_gpu, _FRACTIONAL: _fractional, _SALUS: _salus,
                   _PROCESSES: _trial_processes}[variant.group]
            t0, records, devices, extra = arm(ray, variant, plans, s)
            results.append(_variant_result(variant, specs, records, devices, t0, s, extra))
    finally:
        if started:
            ray.shutdown()
    return results, _notes(s, results)


def plan_for(spec: JobSpec, s: RaySettings) -> TrialPlan:
    return TrialPlan(spec.name, spec.iterations, spec.iteration_seconds * s.time_scale,
                     spec.occupancy, _scaled(spec.persistent_bytes, s),
                     _scaled(spec.ephemeral_peak_bytes, s), s.weights_in_first_iteration)


def _scaled(nbytes: int, s: RaySettings) -> int:
    """Whole MiB: the allocator rounds a request up (to 512 bytes), so a trial that allocates
    exactly its hints would go over the limit they set by a few bytes."""
    return math.ceil(nbytes * s.memory_scale / MiB) * MiB


def _start_ray(ray: Any, exp: Experiment, s: RaySettings) -> bool:
    """A local cluster with ``gpus`` logical GPUs (no real one is used: every GPU is simulated),
    unless one runs already; True when started here."""
    if ray.is_initialized():
        have = ray.cluster_resources().get("GPU", 0)
        if have < s.gpus:
            raise ModeNotSupported(exp.name, "ray", f"the Ray cluster already running has {have:g}"
                                   f" GPUs; the fractional arm needs {s.gpus} (logical ones do)")
        return False
    from salus.ray import start_local

    # CPUs are logical too: enough that the workers and every fractional task fit at once.
    start_local(num_cpus=s.gpus * (s.per_gpu + 1) + 2, num_gpus=s.gpus, include_dashboard=False,
                log_to_driver=False, configure_logging=False)
    return True


def _deadline(plans: list[TrialPlan]) -> float:
    """Seconds to wait for an arm: every trial's work one after the other, ten times."""
    return 120.0 + 10.0 * sum(p.steps * p.step_seconds for p in plans)


def _collect(ray: Any, refs: list[Any], plans: list[TrialPlan]) -> list[TrialRecord]:
    timeout = _deadline(plans)
    try:
        return list(ray.get(refs, timeout=timeout))
    except ray.exceptions.GetTimeoutError:
        raise Error(f"the trials did not finish within {timeout:.0f} s", seconds=timeout,
                    trials=len(refs)) from None


# --- arms 1 and 3: SalusCluster -------------------------------------------------------------

Arm = tuple[float, list[TrialRecord], list[DeviceResult], dict[str, float]]


def _one_per_gpu(ray: Any, variant: Variant, plans: list[TrialPlan], s: RaySettings) -> Arm:
    return _on_salus_cluster(ray, variant.policy, 1, plans, s)


def _salus(ray: Any, variant: Variant, plans: list[TrialPlan], s: RaySettings) -> Arm:
    return _on_salus_cluster(ray, variant.policy, None, plans, s)


def _trial_processes(ray: Any, variant: Variant, plans: list[TrialPlan],
                     s: RaySettings) -> Arm:
    """Salus on Ray with each trial a process of the cluster's salusd. The workers measure no
    device activity here (each trial's kernels run in its own process's simulated device), so
    utilization is each device's trials' kernel time at their occupancy, and the peak memory the
    daemon's."""
    from salus.cli import device_use
    from salus.ray import SalusCluster

    memory = s.gpu_memory - s.context if s.limit_minus_context else s.gpu_memory
    cluster = SalusCluster(simulated_gpus=s.gpus, gpu_memory=memory, policy=variant.policy,
                           torch=False, processes=True)
    try:
        t0 = time.time()
        trials = [cluster.submit(salus_trial, p, name=p.name,
                                 hints={"persistent": p.persistent, "ephemeral_peak": p.ephemeral})
                  for p in plans]
        records = _collect(ray, [t.ref for t in trials], plans)
        stats = cluster.stats()
        socket = cluster.daemon_socket
        assert socket is not None
        use = device_use(socket)
    finally:
        cluster.shutdown()
    by_name = {p.name: p for p in plans}
    span = max((r.finish for r in records), default=t0) - t0
    devices = []
    for w in stats:
        mine = [r for r in records if r.gpu == w.worker]
        # Overlapping kernels of different processes are not slowed (no contention between
        # processes' simulated devices): the sums are capped at the arm's span.
        kernels = min(span, sum(r.steps * by_name[r.name].step_seconds * by_name[r.name].occupancy
                                for r in mine))
        busy = min(span, sum(r.steps * by_name[r.name].step_seconds for r in mine))
        devices.append(DeviceResult(device=w.worker, busy=busy / s.time_scale,
                                    utilization=kernels / s.time_scale,
                                    work=kernels / s.time_scale,
                                    peak_memory=int(use[w.worker].peak / s.memory_scale),
                                    jobs=len(mine)))
    return t0, records, devices, {"peak_trials_per_gpu": float(max(w.peak_running
                                                                   for w in stats))}


def _on_salus_cluster(ray: Any, policy: str, per_gpu: Optional[int], plans: list[TrialPlan],
                      s: RaySettings) -> Arm:
    from salus.ray import SalusCluster

    # Either Salus's limit is what the worker's context leaves of the GPU (a deployment has to
    # set that: on CUDA the runtime takes the GPU's total memory), or the context is a block
    # allocated outside every job that Salus's budget does not know about (salus.ray as is).
    if s.limit_minus_context:
        memory, setup, outside = s.gpu_memory - s.context, None, s.context
    else:
        memory, setup, outside = s.gpu_memory, functools.partial(charge_context, s.context), 0
    cluster = SalusCluster(simulated_gpus=s.gpus, gpu_memory=memory, policy=policy,
                           trials_per_gpu=per_gpu, torch=False, contention=s.contention,
                           worker_setup=setup)
    try:
        t0 = time.time()  # the workers are up: their start is no part of the makespan
        trials = [cluster.submit(salus_trial, p, name=p.name,
                                 hints={"persistent": p.persistent, "ephemeral_peak": p.ephemeral})
                  for p in plans]
        records = _collect(ray, [t.ref for t in trials], plans)
        stats = cluster.stats()
    finally:
        cluster.shutdown()
    devices = [DeviceResult(device=w.worker, busy=w.busy_seconds / s.time_scale,
                            utilization=w.utilization_seconds / s.time_scale,
                            work=w.utilization_seconds / s.time_scale,
                            peak_memory=int((w.peak_allocated + outside) / s.memory_scale),
                            jobs=sum(1 for r in records if r.gpu == w.worker))
               for w in stats]
    return t0, records, devices, {"peak_trials_per_gpu": float(max(w.peak_running
                                                                   for w in stats))}


def charge_context(nbytes: int, runtime: "salus.Runtime") -> None:
    """A GPU worker's setup: the process's CUDA context, memory the GPU holds for the process
    and no job (one per worker process, whatever it runs)."""
    if nbytes:
        runtime.allocate(nbytes)


def salus_trial(plan: TrialPlan) -> TrialRecord:
    """A trial as a Salus job in a GPU worker: its persistent bytes for its life, then per
    iteration its ephemeral bytes while its kernel runs.

    The persistent bytes are allocated in the first iteration, as run mode does: the policy
    then starts that iteration only when they fit too. Allocated when the trial starts
    (outside an iteration, as salus.ray.build_model does), they land in memory that the pack
    policy may already have given to other trials' running iterations (the
    ``weights_in_first_iteration = false`` setting shows it)."""
    import salus.ray as salus_ray

    ctx = salus_ray.trial()
    job = ctx.job
    start = time.time()
    steps = 0
    try:
        if plan.persistent and not plan.weights_in_first_iteration:
            with job:
                job.allocate(plan.persistent, lifetime="persistent")  # freed when it leaves
        for step in range(plan.steps):
            with job.iteration():
                if step == 0 and plan.persistent and plan.weights_in_first_iteration:
                    job.allocate(plan.persistent, lifetime="persistent")
                block = job.allocate(plan.ephemeral) if plan.ephemeral else None
                job.sim_kernel(plan.step_seconds, plan.occupancy)
                job.synchronize()
                if block is not None:
                    job.deallocate(block)
            steps += 1
    except salus.OutOfMemory as e:
        return TrialRecord(plan.name, ctx.worker, start, time.time(), steps, _describe(e))
    return TrialRecord(plan.name, ctx.worker, start, time.time(), steps)


# --- arm 2: Ray fractional GPUs ---------------------------------------------------------------

class SimGpu:
    """One simulated GPU used the way processes share a GPU without MPS: each trial charges its
    own context, allocates what it needs with no scheduler and no limit, and puts its kernels
    on the device's default stream, where they run one at a time (kernels of different CUDA
    contexts do not overlap: the GPU time-slices between them). A Ray actor; each ``run`` call
    is one trial, in a thread of its own."""

    def __init__(self, index: int, memory: int, contention: str) -> None:
        self.index = index
        self.runtime = salus.Runtime("sim", devices=1, memory=memory, contention=contention)
        self._lock = threading.Lock()
        self._running = 0
        self._peak_running = 0

    def ready(self) -> int:
        return self.index

    def run(self, plan: TrialPlan, context: int) -> TrialRecord:
        start = time.time()
        self._count(+1)
        held: list[int] = []
        steps, error = 0, ""
        try:
            for nbytes in (context, plan.persistent):
                if nbytes:
                    held.append(self.runtime.allocate(nbytes))
            for _ in range(plan.steps):
                self._step(plan)
                steps += 1
        except salus.OutOfMemory as e:
            error = _describe(e)  # the trial fails; its process exits, its memory comes back
        finally:
            for ptr in held:
                self.runtime.deallocate(ptr)
            self._count(-1)
        return TrialRecord(plan.name, self.index, start, time.time(), steps, error)

    def _step(self, plan: TrialPlan) -> None:
        block = self.runtime.allocate(plan.ephemeral) if plan.ephemeral else None
        try:
            self.runtime.sim_kernel(0, plan.step_seconds, plan.occupancy)
            self.runtime.synchronize(0)  # waits for the kernels queued before it, too
        finally:
            if block is not None:
                self.runtime.deallocate(block)

    def _count(self, delta: int) -> None:
        with self._lock:
            self._running += delta
            self._peak_running = max(self._peak_running, self._running)

    def stats(self) -> dict[str, float]:
        activity = self.runtime.device_activity(0)
        return {"busy": float(activity["busy_seconds"]),
                "utilization": float(activity["utilization_seconds"]),
                "work": float(activity["work_seconds"]),
                "peak": float(self.runtime.device_stats(0).peak_allocated),
                "peak_running": float(self._peak_running)}


def fractional_trial(gpus: list[Any], plan: TrialPlan, context: int) -> TrialRecord:
    """A Ray task holding ``num_gpus=fraction``: runs its trial on the GPU Ray gave it."""
    import ray

    ids = ray.get_gpu_ids()
    if not ids:
        raise Error(f"trial '{plan.name}': Ray gave the task no GPU")
    return ray.get(gpus[int(ids[0])].run.remote(plan, context))


def _warm(seconds: float) -> int:
    time.sleep(seconds)
    return 0


def _fractional(ray: Any, variant: Variant, plans: list[TrialPlan], s: RaySettings) -> Arm:
    actor = ray.remote(SimGpu).options(num_cpus=0, max_concurrency=4 * s.per_gpu + 4)
    gpus = [actor.remote(i, s.gpu_memory, s.contention) for i in range(s.gpus)]
    try:
        ray.get([g.ready.remote() for g in gpus])
        # max_calls=0: Ray's default for GPU tasks is a new process per task. Processes are
        # started once, here, so that their start (seconds on a 2-core machine) is no part of
        # the makespan, as the SalusCluster workers' start is not.
        options = {"num_gpus": s.fraction, "num_cpus": 0, "max_calls": 0, "max_retries": 0}
        warm = ray.remote(**options)(_warm)
        ray.get([warm.remote(1.0) for _ in range(s.gpus * s.per_gpu)])
        task = ray.remote(**options)(fractional_trial)
        t0 = time.time()
        refs = [task.remote(gpus, p, s.context) for p in plans]
        records = _collect(ray, refs, plans)
        stats = ray.get([g.stats.remote() for g in gpus])
    finally:
        for g in gpus:
            ray.kill(g)
    devices = [DeviceResult(device=i, busy=st["busy"] / s.time_scale,
                            utilization=st["utilization"] / s.time_scale,
                            work=st["work"] / s.time_scale,
                            peak_memory=int(st["peak"] / s.memory_scale),
                            jobs=sum(1 for r in records if r.gpu == i))
               for i, st in enumerate(stats)]
    return t0, records, devices, {"peak_trials_per_gpu": max(st["peak_running"]
                                                             for st in stats)}


# --- results ----------------------------------------------------------------------------------

def _variant_result(variant: Variant, specs: list[JobSpec], records: list[TrialRecord],
                    devices: list[DeviceResult], t0: float, s: RaySettings,
                    extra: dict[str, float]) -> VariantResult:
    by_name = {r.name: r for r in records}
    jobs = [_job_result(spec, by_name[spec.name], t0, s) for spec in specs]
    makespan = max((j.finish for j in jobs), default=0.0)
    iterations = sum(j.iterations for j in jobs)
    failed = [j for j in jobs if j.error]
    lost = sum(j.work for j in failed)
    # failed_jobs overrides the metric's None for none, so that the tables show 0.
    extra = {**extra, "failed_jobs": float(len(failed)), "failed_work_seconds": lost}
    return VariantResult(variant, makespan, iterations / makespan if makespan > 0 else 0.0,
                         jobs, devices, extra=extra)


def _job_result(spec: JobSpec, record: TrialRecord, t0: float, s: RaySettings) -> JobResult:
    start = (record.start - t0) / s.time_scale
    return JobResult(name=spec.name, workload=spec.workload, kind=spec.kind, device=record.gpu,
                     arrival=0.0, first_start=start, finish=(record.finish - t0) / s.time_scale,
                     attained=record.steps * spec.iteration_seconds, work=spec.work_seconds,
                     waiting=start, max_wait=start, iterations=record.steps,
                     error=record.error)


def _describe(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {message}"


def _notes(s: RaySettings, results: list[VariantResult]) -> list[str]:
    per_arm = "; ".join(
        f"{r.variant.label}: {r.extra['failed_jobs']:.0f} failed, at most "
        f"{r.extra['peak_trials_per_gpu']:.0f} trials at once on a GPU"
        + (f", {r.extra['failed_work_seconds']:.0f} s of failed trials' work to redo"
           if r.extra["failed_jobs"] else "")
        for r in results)
    return [
        f"ray mode: each arm on a local Ray cluster of {s.gpus} simulated GPUs of "
        f"{s.gpu_memory / s.memory_scale / (1 << 30):g} GiB; time scaled by {s.time_scale:g} "
        f"(real s per simulated s), memory by {s.memory_scale:g}; at most {s.max_steps} "
        "iterations per trial (coarsened to the same work); every trial submitted at time 0",
        f"per arm: {per_arm}",
        f"assumed: a process's CUDA context holds {s.context_unscaled / MiB:g} MiB of its GPU "
        "(typical of recent CUDA and PyTorch; not measured here). Ray fractional pays it once "
        "per trial, since each Ray task (or Tune trial actor) is a process of its own; one per "
        "GPU and Salus on Ray once per GPU worker process, " + (
            "whose Salus limit is the GPU's memory minus the context (on CUDA Salus takes the "
            "GPU's total memory unless given a limit, and salus.ray has no option for one: a "
            "deployment would need it)" if s.limit_minus_context else
            "as a block allocated in the worker's setup outside every job, which Salus's "
            "budget does not count (salus.ray as it is: its limit is the whole GPU)"),
        f"Ray fractional ({s.fraction:g}): Ray packs {s.per_gpu} trials per GPU by its logical "
        "GPU count and checks no memory. A trial's processes share a GPU without MPS: their "
        "kernels are time-sliced, modelled by putting them all on the device's default stream "
        "(one kernel at a time, in the order enqueued; a real GPU switches contexts in time "
        "slices, at a cost not modelled). A trial whose allocation does not fit fails "
        "(OutOfMemory, as Ray Tune would mark it errored) and is not retried; its memory comes "
        "back and Ray starts the next trial in its place",
        "one per GPU and Salus on Ray run in salus.ray GPU workers (one process per GPU); "
        "Salus's iterations of different trials run on different streams of one process and "
        f"overlap under the {s.contention} contention model (as far as the policy's lanes "
        "let them: pack runs as many as memory allows, fair one at a time per GPU). A Salus "
        "trial allocates its weights " + ("in its first iteration (as run mode does)"
                                           if s.weights_in_first_iteration else
                                           "when it starts, outside an iteration"),
        "memory: in every arm a trial holds its whole ephemeral peak through each iteration "
        "(not the triangle of the assumption above). For Ray fractional's processes that is "
        "what PyTorch's caching allocator does (it keeps a process's peak reserved); for Salus "
        "it is the peak its policies plan with",
        "not modelled: process start (Ray's workers are started before the clock starts in "
        "every arm; a real Tune trial actor also initializes CUDA, seconds), data loading and "
        "other host work between iterations (time slicing hides some of it, so fractional GPUs "
        "fare better on real input-bound trials), and the host overhead of Ray and Python "
        "threads on this machine, which adds to every arm's makespan",
    ] + ([
        "trial processes: each trial starts a Ray actor process of its own once the placer "
        "admits it (its start, about a second here, is in the makespan, as a Tune trial "
        "actor's is), a process of the cluster's salusd, which orders the turns and moves the "
        "pages; the daemon plans with the memory each process reports. Not charged: the CUDA "
        "context each trial process would hold (the limit leaves out one, as for the workers). "
        "Each process's kernels run on a simulated device of its own, so iterations of "
        "different processes that overlap (pack) are not slowed by each other: optimistic for "
        "pack; utilization is the trials' kernel time at their occupancy, capped at the span"
    ] if s.trial_processes else [])
