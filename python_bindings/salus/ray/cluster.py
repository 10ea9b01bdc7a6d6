"""SalusCluster: the driver's handle on the GPU workers and the placer.

On a Ray cluster with GPUs, one worker actor per GPU (``num_gpus=1``: Ray pins the actor to one
GPU, which its runtime then sees as device 0). Without GPUs, ``simulated_gpus`` workers each hold
a simulated GPU, so a local Ray cluster on a CPU machine is a test bed for the same code.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import ray

from .._checks import INT_MAX, INT_MIN, Size, check_int, parse_size
from .._runtime import MemoryHints, _coerce
from ..cli import device_use, ensure_daemon, stop_daemon
from ..errors import InvalidArgument, NotSupported
from ..policies import BUILTIN_POLICIES
from .errors import ClusterClosed
from .local import start_local
from .placement import PLACEMENTS
from .placer import Placer, Request
from .process_worker import ProcessGpuWorker
from .worker import GpuWorker, TrialSpec, WorkerStats

_MAX_TRIALS_PER_WORKER = 64  # the worker actor's threads: trials it can run at once


@dataclass
class Trial:
    """One submitted trial. ``ref`` is a Ray ObjectRef: ``ray.get(trial.ref)`` is its function's
    value, or raises what the function raised (a Salus error keeps its type and fields)."""

    name: str
    trial_id: str
    ref: "ray.ObjectRef"
    _handle: "ClusterHandle"

    def result(self, timeout: Optional[float] = None) -> Any:
        return ray.get(self.ref, timeout=timeout)

    def done(self) -> bool:
        ready, _ = ray.wait([self.ref], timeout=0)
        return bool(ready)

    def cancel(self) -> None:
        """Cancels the trial: a waiting one never starts; a running one is stopped at its next
        iteration boundary and its memory freed. ``result()`` then raises Ray's
        TaskCancelledError."""
        ray.cancel(self.ref)

    def reports(self) -> list[dict[str, Any]]:
        """What the trial reported so far (salus.ray.report), while it runs; [] otherwise."""
        return self._handle.reports(self.trial_id)


@dataclass(frozen=True)
class ClusterHandle:
    """What submitting a trial needs: picklable, so that a Ray Tune trial (another process)
    submits to the same cluster (salus.ray.tune)."""

    placer: Any
    workers: tuple[Any, ...]
    enforce: bool
    torch: bool

    def submit(self, fn: Callable[[Any], Any], config: Any, *, name: str, seed: int,
               hints: Union[MemoryHints, dict[str, Any], None], profile: Optional[str],
               priority: int, owner: Any = None) -> Trial:
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        check_int(seed, "seed")
        check_int(priority, "priority", INT_MIN, INT_MAX)  # a Salus job's priority is a C int
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a trial name must be a non-empty string, not {name!r}")
        h = _coerce(hints, MemoryHints, "hints")
        persistent = parse_size(h.persistent, "hints.persistent")
        ephemeral = parse_size(h.ephemeral_peak, "hints.ephemeral_peak")
        trial_id = f"{name}-{uuid.uuid4().hex[:8]}"
        # With torch, tensors may outlive the job (a result, a cached batch): their blocks stay
        # valid until freed. Without it, what a trial allocated dies with it.
        spec = TrialSpec(trial_id, name, seed, persistent, ephemeral, priority=priority,
                         blocks_outlive_job=self.torch)
        request = Request(spec, profile or str(getattr(fn, "__qualname__", repr(fn))),
                          hinted=hints is not None, enforce=self.enforce, owner=owner)
        return Trial(name, trial_id, self.placer.run.remote(request, fn, config), self)

    def reports(self, trial_id: str, start: int = 0) -> list[dict[str, Any]]:
        answers = ray.get([w.reports.remote(trial_id, start) for w in self.workers])
        return next((a for a in answers if a is not None), [])


def _check_choices(placement: str, policy: str, trials_per_gpu: Optional[int]) -> None:
    if placement not in PLACEMENTS:
        raise InvalidArgument(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    if policy not in BUILTIN_POLICIES:
        raise InvalidArgument(f"unknown policy {policy!r} for the GPU workers (a policy "
                              f"registered here is not known in their processes; built-in: "
                              f"{', '.join(BUILTIN_POLICIES)})")
    if trials_per_gpu is not None:
        check_int(trials_per_gpu, "trials_per_gpu", 1)


def _gpus(simulated_gpus: Optional[int]) -> tuple[int, str, int]:
    """Workers to make, their backend, and the GPUs Ray gives each."""
    if simulated_gpus is not None:
        return check_int(simulated_gpus, "simulated_gpus", 1), "sim", 0
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus == 0:
        raise InvalidArgument("the Ray cluster has no GPU: pass simulated_gpus=N to run on "
                              "simulated GPUs")
    return gpus, "cuda", 1


def _local_gpus() -> int:
    """The GPUs Ray counts on this node (the driver's): a salusd serves its own node only."""
    node = ray.get_runtime_context().get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node and n.get("Alive", True):
            return int(n.get("Resources", {}).get("GPU", 0))
    return 0


def daemon_args(backend: str, gpus: int, memory: Optional[int], policy: str) -> list[str]:
    """salusd's command line for a cluster's trial processes: ``gpus`` simulated devices of
    ``memory`` bytes, or (cuda) every GPU this node's processes see, at most ``memory`` of each
    (None: what is free at start less salusd's reserve)."""
    args = ["--backend", backend, "--policy", policy, "--log-level", "warn"]
    if backend == "sim":
        args += ["--devices", str(gpus)]
    if memory is not None:
        args += ["--memory", str(memory)]
    return args


def trial_actor_options(backend: str, node_id: str,
                        environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Ray options for the actors of one salusd's trial processes: on its node (its socket is
    a local file), and on CUDA seeing the GPUs as the daemon does. Ray gives an actor that asks
    for no GPU an empty CUDA_VISIBLE_DEVICES in some versions (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO),
    which would hide every GPU from the trial: the daemon owns the GPUs, so Ray leaves the
    variable alone (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES) and the driver's own goes along.
    A trial that still sees other GPUs than the daemon's is refused, naming both UUIDs."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}
    if backend == "cuda":
        env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
        visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        options["runtime_env"] = {"env_vars": env}
    return options


class _Daemon:
    """The salusd of a cluster whose trials are processes, on this node (simulated devices, or
    the node's GPUs), in a directory of its own (socket, lock, log) that goes with it."""

    def __init__(self, backend: str, gpus: int, memory: Optional[int], policy: str) -> None:
        self._dir = tempfile.mkdtemp(prefix="salus-ray-")
        self.socket = os.path.join(self._dir, "salusd.sock")
        ensure_daemon(self.socket, daemon_args(backend, gpus, memory, policy))

    def stop(self) -> None:
        stop_daemon(self.socket)
        shutil.rmtree(self._dir, ignore_errors=True)


class SalusCluster:
    """Trials as Salus jobs on Ray GPU workers.

    ``simulated_gpus``: that many workers with a simulated GPU of ``gpu_memory`` each (default
    16 GiB; no GPU needed); None: one worker per GPU of the Ray cluster
    (``ray.cluster_resources()["GPU"]``), where ``gpu_memory`` is the most Salus may hold on each
    (default: the GPU's memory less the runtime's headroom for the CUDA context and libraries).
    ``policy``: the workers' scheduling policy. ``trials_per_gpu``: at most this many trials on
    a GPU at once (None: as many as memory allows). ``placement``: "spread" or "pack" (see
    placement.choose). ``enforce_limits``: a trial with memory hints may use that much and no
    more (its own OutOfMemory, not its neighbours'). ``torch``: route PyTorch's allocations in
    the workers through Salus. ``worker_cpus``: CPUs Ray reserves per worker.

    ``processes``: each trial runs in a Ray actor process of its own, a process of a salusd this
    cluster starts on the driver's node, with the same placement; a trial's crash ends its
    process only. ``worker_cpus`` is then what Ray reserves per trial. On real GPUs the trials
    use the driver node's GPUs (Ray's other nodes are not used: a salusd serves its own node),
    which the cluster reserves in Ray, and ``gpu_memory`` caps what salusd hands out of each
    (default: what is free at its start less its reserve).
    """

    def __init__(self, *, simulated_gpus: Optional[int] = None,
                 gpu_memory: Optional[Size] = None,
                 policy: str = "fair", trials_per_gpu: Optional[int] = None,
                 placement: str = "spread", enforce_limits: bool = True, torch: bool = True,
                 torch_threads: int = 1, worker_cpus: float = 1,
                 contention: str = "processor_sharing",
                 worker_setup: Optional[Callable[[Any], None]] = None,
                 processes: bool = False) -> None:
        _check_choices(placement, policy, trials_per_gpu)
        if processes and worker_setup is not None:
            raise NotSupported("worker_setup has no worker process to run in when trials are "
                               "processes")
        if not ray.is_initialized():
            start_local()
        gpus, backend, actor_gpus = _gpus(simulated_gpus)
        limit = min(trials_per_gpu or _MAX_TRIALS_PER_WORKER, _MAX_TRIALS_PER_WORKER)
        if gpu_memory is None and backend == "sim":
            gpu_memory = "16GiB"
        memory = None if gpu_memory is None else parse_size(gpu_memory, "gpu_memory")
        self._daemon: Optional[_Daemon] = None
        if processes:
            node = ray.get_runtime_context().get_node_id()
            if backend == "cuda":
                gpus = _local_gpus()
                if gpus == 0:
                    raise InvalidArgument("trials as processes use the GPUs of the driver's node, "
                                          "and Ray counts none there")
            self._daemon = _Daemon(backend, gpus, memory, policy)
            capacities = [u.capacity for u in device_use(self._daemon.socket)][:gpus]
            placed = trial_actor_options(backend, node)
            # On CUDA each worker reserves its GPU in Ray (num_gpus=1), so that Ray gives it to
            # no other work; the worker itself runs no CUDA.
            actor = ray.remote(ProcessGpuWorker).options(
                num_cpus=0, num_gpus=1 if backend == "cuda" else 0, max_concurrency=limit + 4,
                scheduling_strategy=placed["scheduling_strategy"])
            self._workers: list[Any] = [
                actor.remote(i, socket=self._daemon.socket, capacity=capacities[i], torch=torch,
                             torch_threads=torch_threads, trial_cpus=worker_cpus,
                             backend=backend, trial_options=placed)
                for i in range(len(capacities))]
        else:
            actor = ray.remote(GpuWorker).options(num_gpus=actor_gpus, num_cpus=worker_cpus,
                                                  max_concurrency=limit + 4)
            self._workers = [
                actor.remote(i, backend=backend, memory=memory, policy=policy,
                             contention=contention, torch=torch, torch_threads=torch_threads,
                             setup=worker_setup)
                for i in range(gpus)]
        infos = ray.get([w.info.remote() for w in self._workers])  # raises a worker's error
        self.capacities = [int(i["capacity"]) for i in infos]
        self._placer: Any = ray.remote(Placer).options(num_cpus=0, max_concurrency=10_000).remote(
            self._workers, self.capacities, max_trials=limit, placement=placement)
        self.handle = ClusterHandle(self._placer, tuple(self._workers), enforce_limits, torch)
        self._counter = itertools.count()
        self._closed = False

    # --- trials ---
    def submit(self, fn: Callable[[Any], Any], config: Any = None, *,
               name: Optional[str] = None, seed: int = 0,
               hints: Union[MemoryHints, dict[str, Any], None] = None,
               profile: Optional[str] = None, priority: int = 0) -> Trial:
        """Runs ``fn(config)`` as a trial: returns at once; the trial waits for a GPU it fits.

        ``hints``: its persistent memory and ephemeral peak (placement and, with
        ``enforce_limits``, its limit). Without hints, trials of the same ``profile`` (default:
        the function's qualified name) are placed by what the last one measured, and the first
        runs on a GPU of its own. ``seed``: what salus.ray.build_model seeds torch with.
        """
        if self._closed:
            raise ClusterClosed("this SalusCluster was shut down")
        number = next(self._counter)
        return self.handle.submit(fn, config, name=f"trial-{number}" if name is None else name,
                                  seed=seed, hints=hints, profile=profile, priority=priority)

    def map(self, fn: Callable[[Any], Any], configs: Iterable[Any], **kwargs: Any) -> list[Trial]:
        """One trial per config, named ``<name or fn>-<i>``, seeded with ``seed + i``."""
        base = kwargs.pop("name", getattr(fn, "__name__", "trial"))
        seed = kwargs.pop("seed", 0)
        return [self.submit(fn, c, name=f"{base}-{i}", seed=seed + i, **kwargs)
                for i, c in enumerate(configs)]

    # --- state ---
    def stats(self) -> list[WorkerStats]:
        return ray.get([w.stats.remote() for w in self._workers])

    def load(self) -> list[dict[str, Any]]:
        """The placer's picture: trials and bytes committed per GPU."""
        return ray.get(self._placer.load.remote())

    def waiting(self) -> int:
        return int(ray.get(self._placer.waiting.remote()))

    @property
    def workers(self) -> list[Any]:
        return list(self._workers)

    @property
    def daemon_socket(self) -> Optional[str]:
        """The socket of the salusd whose processes the trials are (``processes=True``)."""
        return self._daemon.socket if self._daemon is not None else None

    # --- life ---
    def shutdown(self) -> None:
        """Kills the workers and the placer: trials still running end with an actor error."""
        if self._closed:
            return
        self._closed = True
        for actor in [self._placer, *self._workers]:
            ray.kill(actor)
        if self._daemon is not None:
            self._daemon.stop()

    def __enter__(self) -> "SalusCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
