"""salus.torch: PyTorch's allocations through a Salus runtime.

``salus.torch.enable(runtime)``:

* simulated backend (no GPU): c10's CPU allocator becomes Salus, so CPU tensors live in simulated
  GPU memory and real training loops run under Salus's scheduling and memory accounting;
* CUDA backend: PyTorch's CUDA allocations go through Salus (its pluggable allocator), and each
  job's iteration runs on the stream Salus hands it, as PyTorch's current stream. Salus answers
  ``Tensor.record_stream``, ``torch.cuda.memory_allocated``, ``max_memory_allocated``,
  ``memory_reserved``, ``memory_stats`` (the "all" figures: Salus has no small and large pools)
  and ``reset_peak_memory_stats`` (Salus resets the peaks of every device at once) from its own
  statistics, and ``torch.cuda.empty_cache()`` trims its cached pages (those unused since the
  previous call go back: a script that calls it every step keeps what its steps use). CUDA
  graphs are not supported: capturing one (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``) or
  using ``torch.cuda.MemPool`` raises an error naming Salus before any capture begins.

The GIL: an allocation may wait (for memory another job's iteration holds, for a spill), and
PyTorch allocates holding the GIL in places; the glue releases it around such calls, so that the
other Python threads, whose work the wait may depend on, go on.

Attribution: allocations inside ``with job.iteration():`` are that job's ephemeral memory
(promoted to persistent if they survive the iteration); inside ``with job:`` its persistent
memory; anything else is unattributed. Importing this module does not import torch.

fork(): a forked child (a ``DataLoader`` worker with ``num_workers > 0``, which Linux forks by
default) starts with the glue off. Its new tensors come from PyTorch's own CPU allocator, tensors
inherited from the parent stay readable (their memory is the parent's simulated GPU memory,
shared with the parent rather than copied on write: do not modify them in place in the child),
and freeing them in the child leaves them to the parent. ``enable()`` in the child routes it to
a runtime of its own (made in the child: the parent's raises NotSupported there).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from . import _framework_hooks
from ._framework_hooks import FrameworkHooks
from .errors import Error, InvalidArgument, NotSupported, SettingIgnored

if TYPE_CHECKING:
    from ._runtime import Iteration, Job, Runtime

_glue: Any = None
_mode: Optional[str] = None  # "cpu" or "cuda" while enabled
# PyTorch's name for its CUDA allocator once Salus's was installed ("salus"): another name later
# means a script replaced it (check_allocator_kept).
_installed_allocator: Optional[str] = None


def _off_in_child() -> None:
    """A forked child starts with the glue off (the C++ glue switched itself off there)."""
    global _mode
    _mode = None


os.register_at_fork(after_in_child=_off_in_child)


def _load() -> Any:
    global _glue
    if _glue is None:
        import torch  # noqa: F401  (loads libc10 before the glue)

        try:
            from . import _salus_torch
        except ImportError as e:
            raise NotSupported(
                "salus was built without its PyTorch glue (libtorch was not found at build time): "
                "install torch first, then reinstall salus with "
                "'pip install --no-build-isolation .'") from e
        _glue = _salus_torch
    return _glue


def enable(runtime: Optional["Runtime"] = None) -> None:
    """Routes PyTorch's allocations to ``runtime`` (default: salus.default_runtime())."""
    global _mode
    from ._runtime import Runtime, default_runtime

    if runtime is None:
        runtime = default_runtime()
    if not isinstance(runtime, Runtime):
        raise TypeError(f"runtime must be a salus.Runtime, not {type(runtime).__name__}")
    glue = _load()
    if glue.enabled():
        raise InvalidArgument("salus.torch is enabled already: call salus.torch.disable() first")
    python_policy = bool(runtime._impl.python_policy)
    if runtime.backend_name == "sim":
        glue.enable_cpu(runtime._capsule(), python_policy)
        _mode = "cpu"
        return
    import torch

    if torch.cuda.is_initialized():
        raise InvalidArgument(
            "PyTorch's CUDA allocator is initialized already (a CUDA tensor or call came first): "
            "call salus.torch.enable(runtime) before any CUDA work, at the start of the process")
    glue.enable_cuda(runtime._capsule(), python_policy)
    try:
        _install_cuda_allocator(glue)
    except Exception:
        glue.disable()
        raise
    _mode = "cuda"
    global _installed_allocator
    _installed_allocator = torch.cuda.get_allocator_backend()
    for warning in ignored_alloc_conf(os.environ):
        warnings.warn(warning, stacklevel=2)


# PyTorch's variables that configure its own CUDA caching allocator, which Salus replaces.
_ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def ignored_alloc_conf(environ: Mapping[str, str]) -> list[SettingIgnored]:
    """What of ``environ`` configures PyTorch's own CUDA allocator, which Salus's replaces:
    one warning per variable set, naming its options (expandable_segments,
    backend:cudaMallocAsync, max_split_size_mb, ...)."""
    out = []
    for variable in _ALLOC_CONF_VARIABLES:
        value = environ.get(variable, "").strip()
        if not value:
            continue
        options = [part.split(":", 1)[0].strip() for part in value.split(",") if part.strip()]
        reason = ("Salus's allocator replaces PyTorch's caching allocator, which these options "
                  "configure")
        out.append(SettingIgnored(
            f"{variable}='{value}' is ignored: {reason} ({', '.join(options)})",
            setting=variable, value=value, reason=reason))
    return out


def check_allocator_kept() -> None:
    """NotSupported when the process's CUDA allocator is no longer Salus's (a script called
    torch.cuda.memory.change_current_allocator): its memory would bypass Salus unseen."""
    if _mode != "cuda" or _installed_allocator is None:
        return
    import torch

    backend = torch.cuda.get_allocator_backend()
    if backend != _installed_allocator:
        raise NotSupported(
            f"PyTorch's CUDA allocator was replaced (it is now '{backend}'): the process's memory "
            "no longer goes through Salus, which shares this GPU on the strength of it; a script "
            "under salus run or salus.torch must not call change_current_allocator",
            allocator=backend)


def _install_cuda_allocator(glue: Any) -> None:
    """Salus's CUDA allocator becomes PyTorch's (PyTorch keeps it for the life of the process)."""
    if hasattr(glue, "install_cuda_allocator"):
        glue.install_cuda_allocator()
        return
    # Built without libsalus_torch_cuda (no CUDA headers at build time): PyTorch's plain pluggable
    # allocator, which lacks record_stream, statistics and empty_cache.
    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        glue.library_path(), "salus_torch_cuda_malloc", "salus_torch_cuda_free")
    torch.cuda.memory.change_current_allocator(allocator)


def disable() -> None:
    """New tensors use PyTorch's own CPU allocator again (CUDA: PyTorch cannot swap its CUDA
    allocator back in a running process; the glue stops routing, new allocations fail)."""
    global _mode
    if _glue is not None:
        _glue.disable()
    _mode = None


def enabled() -> bool:
    return _glue is not None and bool(_glue.enabled())


def counters() -> dict[str, int]:
    """Allocations, frees and failed frees (logged) through the glue."""
    return dict(_load().counters())


def record_stream(tensor: Any, stream: Any) -> None:
    """``tensor`` is also used on ``stream`` (CUDA): its memory is not reused before the work
    enqueued there by the time it is freed has finished."""
    tensor.record_stream(stream)


# --- a script as one process of salusd ------------------------------------------------------------

class _Shared:
    """What share() set up, undone at exit."""

    def __init__(self, runtime: "Runtime", job: "Job", hook: Any) -> None:
        self.runtime = runtime
        self.job = job
        self.hook = hook
        # Begins the first turn at the script's first forward (removed then): see share().
        self.first_forward_hook: Any = None
        self.pid = os.getpid()  # the process whose job this is (not a forked child)
        self.iteration: Optional["Iteration"] = None  # the one marked here, not by the script
        self.marking = False  # an iteration marked here is being entered
        self.auto = True  # iterations are marked here until the script marks its own
        self.by_salus_run = False  # set up before the script by `salus run`
        self.stats_path: Optional[str] = None  # where the job's statistics go at exit
        # CUDA_VISIBLE_DEVICES when Salus initialized CUDA (None: unset; checked at each mark
        # until it changed once, then warned about).
        self.visible_at_start: Optional[str] = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.visible_warned = False

    def check_visible_devices(self) -> None:
        """Warns, once, when the script changed CUDA_VISIBLE_DEVICES after Salus had initialized
        CUDA (salus run and share() connect before the script's first CUDA call)."""
        now = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.visible_warned or _mode != "cuda" or now == self.visible_at_start:
            return
        self.visible_warned = True
        reason = ("Salus initialized CUDA before the script set it (salus run connects before "
                  "the script's first line); set it on salus run's command line instead")
        warnings.warn(SettingIgnored(
            f"CUDA_VISIBLE_DEVICES='{now}' is ignored: {reason}", setting="CUDA_VISIBLE_DEVICES",
            value=now or "", reason=reason), stacklevel=3)

    def mark(self) -> None:
        """Ends the iteration marked here, if any, and begins the next."""
        check_allocator_kept()
        self.check_visible_devices()
        self.end_marked()
        it = self.job.iteration()
        self.marking = True
        try:
            it.__enter__()
        finally:
            self.marking = False
        self.iteration = it

    def end_marked(self) -> None:
        it, self.iteration = self.iteration, None
        if it is not None:
            it.__exit__(None, None, None)


_shared: Optional[_Shared] = None


def share(name: Optional[str] = None, *, socket: Any = None, priority: int = 0,
          kind: str = "training", limit: Any = None) -> "Job":
    """Makes this training script one process of the node's salusd, in one line.

    Connects to salusd (``socket``: None for ``$SALUS_SOCKET`` or the per-user default), routes
    PyTorch's memory through it (:func:`enable`) and adds one job (``name``: the script's name by
    default) that the calling thread works for. Iterations are marked at PyTorch's optimizer
    steps: each ``optimizer.step()`` ends one turn and waits for the next; the first turn begins
    at the first forward of any module. So memory made before it (weights) is the job's persistent
    memory, what a step makes and keeps (optimizer state) becomes so as its turn ends, and each
    step's activations are ephemeral. A script that runs several optimizers per iteration, or
    accumulates gradients over several steps, takes several turns per iteration: mark its
    iterations with ``job.iteration()`` instead. ``limit`` caps the job's bytes (``"2GiB"``; None:
    no cap). Returns the job; at exit the turn ends and the job leaves. Under ``salus run`` the
    script is shared already, and a call returns that job.
    """
    global _shared
    import atexit
    import sys
    from pathlib import Path

    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ._runtime import connect

    if _shared is not None:
        if _shared.by_salus_run:
            return _shared.job
        raise InvalidArgument("salus.torch.share() was called already in this process")
    runtime = connect(socket)
    enable(runtime)
    job_name = name or Path(sys.argv[0] or "script").stem or "script"
    job = runtime.add_job(job_name, kind=kind, priority=priority,
                          limits=None if limit is None else {"total": limit})
    job.__enter__()  # the thread's allocations are the job's from here on
    state = _Shared(runtime, job, None)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if state.auto:
            state.mark()

    def first_forward(module: Any, args: Any) -> None:
        # The first step runs inside a turn too, from its first forward: otherwise it would run
        # beside the others' turns, its memory unplanned, where memory is tight the one that
        # fails (issue 34). Weights made before it are still the job's persistent memory; what
        # the first step makes and keeps (optimizer state) outlives the turn and becomes so.
        # A forked child (a DataLoader worker running transforms that are modules) inherits the
        # hook, not the job.
        if os.getpid() != state.pid:
            return
        hook = state.first_forward_hook
        state.first_forward_hook = None
        if hook is not None:
            hook.remove()
        if state.auto and state.iteration is None and not state.marking:
            state.mark()

    if kind == "training":
        from torch.nn.modules.module import register_module_forward_pre_hook

        state.hook = register_optimizer_step_post_hook(after_step)
        state.first_forward_hook = register_module_forward_pre_hook(first_forward)
    _shared = state
    atexit.register(_unshare)
    return job


def _unshare() -> None:
    global _shared
    state, _shared = _shared, None
    if state is None:
        return
    if state.hook is not None:
        state.hook.remove()
    if state.first_forward_hook is not None:
        state.first_forward_hook.remove()
    try:
        state.end_marked()
        if state.stats_path:
            _write_stats(state.job, state.stats_path)
    finally:
        state.job.__exit__(None, None, None)
        disable()
        state.job.leave()
        state.runtime.close()


def _write_stats(job: "Job", path: str) -> None:
    """The job's statistics as JSON (``salus run --stats``): what the rules made persistent and
    ephemeral, its turns and waits."""
    import dataclasses
    import json

    with open(path, "w") as f:
        json.dump(dataclasses.asdict(job.stats()), f)


def _shared_job(what: str) -> "Job":
    """The job of :func:`share` (or of ``salus run``); InvalidArgument naming ``what`` if none."""
    if _shared is None:
        raise InvalidArgument(f"{what}: this process has no shared job: run it under 'salus run' "
                              "or call salus.torch.share() first")
    return _shared.job


# --- the hooks salus._runtime calls around each iteration -----------------------------------------

class _TorchHooks(FrameworkHooks):
    def user_iteration(self, job: "Job") -> None:
        """The script marks an iteration of the shared job itself: from now on its marks are the
        only ones (the optimizer-step marks stop, an iteration marked here ends first)."""
        state = _shared
        if state is None or state.job is not job or state.marking or not state.auto:
            return
        state.auto = False
        state.end_marked()

    def enter_iteration(self, it: "Iteration") -> None:
        if _mode != "cuda":
            return
        import torch

        device = it._job.device
        previous = torch.cuda.current_stream(device)
        stream = torch.cuda.ExternalStream(it.stream, device=device)
        # The job's stream is non-blocking: work the thread queued before the iteration (inputs
        # copied in, a state_dict loaded) must be done before the iteration's work reads it.
        stream.wait_stream(previous)
        ctx = torch.cuda.stream(stream)
        ctx.__enter__()
        it._torch_stream_ctx = ctx
        it._torch_streams = (previous, stream)

    def exit_iteration(self, it: "Iteration") -> None:
        ctx = getattr(it, "_torch_stream_ctx", None)
        if ctx is None:
            return
        previous, stream = it._torch_streams
        it._torch_stream_ctx = None
        it._torch_streams = None
        ctx.__exit__(None, None, None)
        # Back on the previous stream, what follows (state_dict(), .cpu(), the next batch) waits
        # for the iteration's work instead of reading values still being written.
        previous.wait_stream(stream)

    def pending_error(self) -> Optional[Error]:
        return _pending_error()


def _pending_error() -> Optional[Error]:
    """The Salus error behind PyTorch's last allocator failure on this thread, if any."""
    if _glue is None:
        return None
    try:
        _glue.raise_last_error()
    except Error as e:
        return e
    return None


_framework_hooks.install(_TorchHooks())

__all__ = ["enable", "disable", "enabled", "counters", "record_stream", "share"]
