"""The hooks a framework's glue installs into the core (salus.torch installs PyTorch's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ._runtime import Iteration, Job


class FrameworkHooks:
    """What a framework's glue does around a job's iterations (salus.torch binds PyTorch's stream
    to the job's, and names the Salus error behind its allocator's last failure). The core calls
    the installed hooks and never imports a glue: a glue depends on the core, not the reverse.
    These defaults do nothing, as the glue does until it is enabled."""

    def user_iteration(self, job: "Job") -> None:
        """The script marks an iteration of ``job`` itself (before its turn is asked for)."""

    def enter_iteration(self, it: "Iteration") -> None:
        """The iteration's turn has begun and the thread is bound to its job."""

    def exit_iteration(self, it: "Iteration") -> None:
        """The iteration's body has ended (before its turn does)."""

    def pending_error(self) -> "Optional[BaseException]":
        """The Salus error behind the framework's last allocation failure on this thread."""
        return None


current = FrameworkHooks()  # the hooks every iteration calls


def install(hooks: FrameworkHooks) -> None:
    """Makes ``hooks`` the ones every iteration calls (one glue at a time: the last installed)."""
    global current
    current = hooks
