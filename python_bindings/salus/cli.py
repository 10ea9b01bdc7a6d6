"""``salus``: run an unmodified PyTorch script as a job of the node's salusd, or see the daemon.

    salus run [--name NAME] [--kind training|inference] [--priority N] [--limit SIZE]
              [--socket PATH] [--stats PATH] -- python train.py ARGS
    salus status [--socket PATH]

``salus run`` starts the user's salusd if none answers at the socket (its log beside the socket,
``PATH.log``), then runs the command with Salus set up in its Python process before the script:
PyTorch's memory comes from salusd, and each ``optimizer.step()`` ends one turn and waits for the
next (:func:`salus.torch.share` has the rules). The command's exit status is ``salus run``'s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from ._checks import parse_size
from .errors import DeviceError, InvalidArgument

_AUTORUN = Path(__file__).with_name("_autorun")


def default_socket() -> str:
    """The clients' default socket, by the same rule as ``salus_runtime_connect(NULL)``."""
    if os.environ.get("SALUS_SOCKET"):
        return os.environ["SALUS_SOCKET"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "salusd.sock")
    return f"/tmp/salus-{os.getuid()}/salusd.sock"


def _answers(path: str) -> bool:
    """Whether a daemon accepts connections at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def salusd_binary() -> str:
    """``$SALUSD``, else the salusd shipped beside this Python (``pip install .`` puts it with the
    scripts), else one on PATH."""
    if os.environ.get("SALUSD"):
        return os.environ["SALUSD"]
    found = shutil.which("salusd", path=sysconfig.get_path("scripts")) or shutil.which("salusd")
    if found is None:
        raise DeviceError("salusd is not installed beside this Python nor on PATH "
                          "(pip install . ships it)", call="salusd", status="NOT_INSTALLED",
                          status_code=0)
    return found


def ensure_daemon(path: str, daemon_args: Sequence[str] = (), wait_s: float = 10.0) -> bool:
    """Starts salusd at ``path`` unless one answers there; True when this call started it.

    The daemon runs in a session of its own, so that it outlives the command (the next
    ``salus run`` reuses it). Two calls racing to start one are fine: the second daemon finds the
    first one's lock and exits, and both calls wait for the socket."""
    if _answers(path):
        return False
    private = f"/tmp/salus-{os.getuid()}"
    if os.path.dirname(path) == private:
        os.makedirs(private, mode=0o700, exist_ok=True)  # salusd checks that it is this user's
    # The daemon's log names other processes' jobs: its user's alone to read.
    log_path = f"{path}.log"
    log = open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")
    with log:
        daemon = subprocess.Popen([salusd_binary(), "--socket", path, "--own-log", log_path,
                                   *daemon_args],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    # A daemon that refused to start (another won the race) exits; the winner's socket comes. One
    # that refused its arguments exits too, and says why at once, not after the wait.
    deadline = time.monotonic() + wait_s
    exited_at: Optional[float] = None
    while not _answers(path) and time.monotonic() < deadline:
        if exited_at is None and daemon.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() - exited_at > 0.5:
            break  # it exited and no other daemon came up meanwhile
        time.sleep(0.02)
    if not _answers(path):
        tail = Path(f"{path}.log").read_text(errors="replace")[-2000:]
        why = (f"exited with status {daemon.returncode}" if daemon.poll() is not None
               else f"did not answer within {wait_s:.0f} s")
        raise DeviceError(f"salusd did not start at '{path}': it {why}; its log:\n{tail}",
                          call="salusd", status="NOT_STARTED", status_code=0)
    return True


class DeviceUse(NamedTuple):
    """One GPU of a salusd, in bytes: what its processes hold now, the most they held at once,
    and what the daemon hands out."""

    granted: int
    peak: int
    capacity: int


def device_use(path: str) -> list[DeviceUse]:
    """Each GPU's use, from the table of the salusd at ``path`` (``salusd --status``);
    DeviceError when none answers."""
    done = subprocess.run([salusd_binary(), "--socket", path, "--status"], capture_output=True,
                          text=True, timeout=10)
    if done.returncode != 0:
        raise DeviceError(f"salusd --status at '{path}': {done.stderr.strip()}", call="salusd",
                          status="NOT_ANSWERING", status_code=done.returncode)
    out: list[DeviceUse] = []
    lines = iter(done.stdout.splitlines())
    for line in lines:
        if line.startswith("device "):
            break
    for line in lines:  # device  pages  granted MiB  peak MiB  capacity MiB  fenced  behind
        cols = line.split()
        if not cols or not cols[0].isdigit():
            break
        mib = [int(float(c) * (1 << 20)) for c in cols[2:5]]
        out.append(DeviceUse(*mib))
    return out


def stop_daemon(path: str, wait_s: float = 10.0) -> None:
    """Stops the salusd at ``path`` (SIGTERM to the pid its lock file names) and waits until it
    has removed its socket; nothing if none runs there."""
    try:
        os.kill(int(Path(f"{path}.lock").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        return  # gone already
    deadline = time.monotonic() + wait_s
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InvalidArgument("no command given (salus run -- python train.py ...)")
    if args.limit is not None:
        parse_size(args.limit, "--limit")  # a bad size is said here, not inside the script
    path = args.socket or default_socket()
    # What would fail after the daemon started, or after training, fails first.
    executable = shutil.which(command[0])
    if executable is None:
        raise InvalidArgument(f"cannot run {command[0]!r}: no such command (nothing was started)")
    if args.stats is not None:
        folder = Path(args.stats).resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise InvalidArgument(f"--stats {args.stats!r}: the folder {str(folder)!r} does not "
                                  "exist or is not writable")
    daemon_args = ["--backend", args.backend]
    if args.memory:
        daemon_args += ["--memory", args.memory]
    if args.policy:
        daemon_args += ["--policy", args.policy]
    if not ensure_daemon(path, daemon_args) and (args.memory or args.policy):
        given = " ".join(f"--{k} {v}" for k, v in (("memory", args.memory),
                                                   ("policy", args.policy)) if v)
        print(f"salus run: {given} ignored: a salusd already runs at '{path}' with its own "
              "settings ('salus status' shows them; stop it to start one with these)",
              file=sys.stderr)
    if args.name is None:
        args.name = default_job_name(command)
    env = dict(os.environ)
    env.update({
        "SALUS_SOCKET": path,
        "SALUS_RUN": "1",
        "SALUS_RUN_KIND": args.kind,
        "SALUS_RUN_PRIORITY": str(args.priority),
        "PYTHONPATH": os.pathsep.join(p for p in (str(_AUTORUN), env.get("PYTHONPATH")) if p),
    })
    for key, value in (("SALUS_RUN_NAME", args.name), ("SALUS_RUN_LIMIT", args.limit),
                       ("SALUS_RUN_STATS", args.stats)):
        if value is not None:
            env[key] = str(value)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        raise InvalidArgument(f"cannot run {command[0]!r}: {e.strerror}") from e
    return 127  # not reached


def default_job_name(command: Sequence[str]) -> str:
    """A job's name from its command line: the script's stem (``python train.py`` -> train), the
    module (``python -m pkg.train`` -> pkg.train), ``python -c`` for inline code, else the
    command's own name. (Inside the process, ``sys.argv[0]`` is still ``-m`` or ``-c`` when Salus
    sets up, before Python has found the module.)"""
    program = Path(command[0]).name
    if program.startswith("python"):
        args = list(command[1:])
        while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
            args = args[1:]  # interpreter options (-u, -O, -X ...)
        if len(args) >= 2 and args[0] == "-m":
            return args[1]
        if args and args[0] == "-c":
            return f"{program} -c"
        if args:
            return Path(args[0]).stem or program
    return program


def _status(args: argparse.Namespace) -> int:
    path = args.socket or default_socket()
    return subprocess.call([salusd_binary(), "--socket", path, "--status"])


_EXAMPLE = """example:
  salus run -- python train.py --epochs 3
  salus run --name bert --limit 4GiB --backend sim --memory 8GiB -- python -m my.train
  salus status"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="salus", description="salus: run an unmodified PyTorch script as a job of the "
        "node's salusd, or see the daemon", epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="run a command as a job of salusd", epilog=_EXAMPLE,
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Starts the user's salusd if none answers at the socket, "
                         "then runs the command with PyTorch's memory and turns through it.")
    run.add_argument("--name", help="the job's name (default: the script's)")
    run.add_argument("--kind", choices=["training", "inference"], default="training")
    run.add_argument("--priority", type=int, default=0)
    run.add_argument("--limit", help="the job's byte limit, e.g. 2GiB")
    run.add_argument("--socket", help="salusd's socket (default: $SALUS_SOCKET, else per user)")
    run.add_argument("--stats", help="write the job's statistics here (JSON) at exit")
    run.add_argument("--backend", default="auto", choices=["auto", "cuda", "sim"],
                     help="for a daemon this command starts")
    run.add_argument("--memory", help="for a daemon this command starts: its memory, e.g. 8GiB")
    run.add_argument("--policy", help="for a daemon this command starts: its policy")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    status = sub.add_parser("status", help="print salusd's processes, jobs and memory")
    status.add_argument("--socket")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args) if args.what == "run" else _status(args)
    except (InvalidArgument, DeviceError) as e:
        print(f"salus {args.what}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
