"""salus.ray: trials share GPUs across a Ray cluster as Salus jobs.

One Ray actor per GPU (``num_gpus=1``) holds a Salus runtime; trials run in it as jobs, several
per GPU, each in a thread of its own, and take turns at iteration boundaries. A placer admits
each trial to the GPU where its memory fits (Salus's admission rule, placement.py), not by
logical fractions; a trial that fits nowhere waits. Results, errors and cancellation come back
through Ray::

    import ray, salus.ray

    salus.ray.start_local()                       # or ray.init(address=...) for a cluster
    cluster = salus.ray.SalusCluster()            # one worker per GPU; simulated_gpus=N without
    trials = [cluster.submit(train, {"lr": lr}, hints={"persistent": "300MiB",
                                                       "ephemeral_peak": "1GiB"})
              for lr in (1e-3, 3e-3, 1e-2)]
    results = ray.get([t.ref for t in trials])

Inside ``train(config)``, :func:`job` is the trial's Salus job (``with salus.ray.job().
iteration():``), :func:`build_model` makes the weights its persistent memory, :func:`report`
records metrics. Ray Tune: :func:`salus.ray.tune.trainable`.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401
except ImportError as _missing:
    raise ImportError("salus.ray needs Ray, which is not importable here "
                      f"({_missing}): pip install 'salus[ray]'", name="ray") from _missing

from .cluster import SalusCluster, Trial
from .context import TrialContext, build_model, device, job, report, trial
from .errors import ClusterClosed, FitsNoGpu
from .local import start_local
from .placement import Need, choose
from .worker import WorkerStats

__all__ = ["SalusCluster", "Trial", "TrialContext", "build_model", "device", "job", "report",
           "trial", "start_local", "ClusterClosed", "FitsNoGpu", "Need", "choose", "WorkerStats"]
