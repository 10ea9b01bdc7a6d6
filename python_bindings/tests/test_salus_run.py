"""`salus run` with real processes: three training scripts that do not import salus share one
simulated GPU through salusd, take turns at their optimizer steps, and end bitwise where the same
scripts end alone in plain PyTorch; their memory is classified by the rules (before the first
step persistent, then ephemeral); a script over its limit fails alone with salus.OutOfMemory; a
SIGKILLed one costs the others nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterator

import pytest

from test_salusd import Daemon, daemon_status

SCRIPT = Path(__file__).with_name("unmodified_train.py")
MODELS = ["cnn", "mlp", "small"]


def salus_cli() -> str:
    found = shutil.which("salus", path=sysconfig.get_path("scripts")) or shutil.which("salus")
    if found is None:
        pytest.fail("the salus command is not installed beside this Python (pyproject's scripts)")
    return found


def salus_run(socket: str, name: str, model: str, out: Path, *extra: str,
              steps: int = 6, script_args: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [salus_cli(), "run", "--socket", socket, "--name", name, *extra, "--",
         sys.executable, str(SCRIPT), "--model", model, "--steps", str(steps), "--out", str(out),
         *(script_args or [])],
        stderr=subprocess.PIPE, text=True)


def alone(tmp: Path, model: str, steps: int = 6) -> dict:
    """What the script ends with in plain PyTorch, no Salus anywhere."""
    out = tmp / f"alone-{model}-{steps}.json"
    subprocess.run([sys.executable, str(SCRIPT), "--model", model, "--steps", str(steps), "--out",
                    str(out)], check=True, timeout=120)
    return json.loads(out.read_text())


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, "--policy", "fair", "--memory", "512MiB", "--trace",
               str(tmp_path / "trace.json"))
    yield d
    d.stop()


def iterations(trace: Path) -> list[tuple[float, float, str]]:
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                  if e.get("cat") == "iteration")


def asked_turns(trace: Path) -> list[tuple[float, float, str]]:
    """(asked, began, name) of each iteration: when its job asked for the turn and got it."""
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return sorted((e["args"]["asked"], e["ts"], e["name"]) for e in events
                  if e.get("cat") == "iteration")


def test_the_script_knows_nothing_of_salus() -> None:
    assert "salus" not in SCRIPT.read_text().split('"""', 2)[2]


def test_three_unmodified_scripts_take_turns_and_train_as_alone(traced: Daemon,
                                                               tmp_path: Path) -> None:
    steps = 30
    ready = tmp_path / "ready"
    procs = {m: salus_run(traced.socket, f"job-{m}", m, tmp_path / f"{m}.json",
                          "--stats", str(tmp_path / f"{m}.stats.json"),
                          steps=steps, script_args=["--wait-for", str(ready)])
             for m in MODELS}
    # They train together once all three are jobs of the daemon, whatever importing torch cost
    # each of them.
    deadline = time.monotonic() + 120
    while sum(line.startswith("job-") for line in daemon_status(traced).splitlines()) < 3:
        assert all(p.poll() is None for p in procs.values()), "a script ended early"
        assert time.monotonic() < deadline, daemon_status(traced)
        time.sleep(0.05)
    ready.touch()
    for m, p in procs.items():
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, f"{m}: {err}"
    assert traced.stop() == 0, traced.log.read_text()
    for m in MODELS:
        shared = json.loads((tmp_path / f"{m}.json").read_text())
        assert shared["weights"] == alone(tmp_path, m, steps)["weights"], m  # bitwise
        stats = json.loads((tmp_path / f"{m}.stats.json").read_text())
        assert stats["name"] == f"job-{m}"
        # The first from the first forward to the first optimizer step (before, the first step
        # ran outside any turn), then one from each step to the next, the last one to the exit.
        assert stats["iterations"] == steps + 1
        memory = stats["memory"]
        # Before the first step returns: weights and momentum buffers (and the first step's
        # activations), so at least twice the parameters are persistent.
        assert memory["persistent"]["peak"] >= 2 * shared["param_bytes"], (m, memory)
        # Each later step's activations and gradients are the iteration's: ephemeral, all gone.
        assert memory["ephemeral"]["peak"] > 0 and memory["ephemeral"]["in_use"] == 0, (m, memory)
    spans = iterations(tmp_path / "trace.json")
    assert sorted({n for _, _, n in spans}) == sorted(f"job-{m}" for m in MODELS)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        assert e0 <= b1 + 1.0, f"{n0} and {n1} ran iterations at once"  # us; the trace's rounding
    assert len(spans) == 3 * (steps + 1)
    # What fair guarantees, whatever the machine's timing: a job asking for its first turn has
    # attained no GPU time, the least there is, and among equal keys the one never served goes
    # first, so each other job takes at most one turn between that ask and the job's first turn.
    # (How often turns change hands later is the machine's timing: a script still preparing its
    # next step is not waiting. A busy machine once ran one script's 31 iterations before
    # another's first.)
    turns = asked_turns(tmp_path / "trace.json")
    for m in MODELS:
        name = f"job-{m}"
        asked, began = min((b, a) for a, b, n in turns if n == name)[::-1]
        ahead = [n for _, b, n in turns if n != name and asked < b < began]
        assert len(ahead) == len(set(ahead)), (name, asked, began, ahead)


THIRD_PARTY = Path(__file__).with_name("third_party_train.py")


@pytest.mark.parametrize("policy", ["pack"])
def test_third_party_models_as_unmodified_scripts_train_as_alone(policy: str,
                                                                  tmp_path: Path) -> None:
    """torchvision, timm and transformers models in scripts that know nothing of Salus, three
    processes at once under pack (which plans with the memory each process reports), end bitwise
    where the same scripts end alone in plain PyTorch."""
    for library in ("torchvision", "timm", "transformers"):
        pytest.importorskip(library)
    assert "salus" not in THIRD_PARTY.read_text().split('"""', 2)[2]
    models, steps = ["mobilenet", "vit", "gpt2"], 4
    daemon = Daemon(tmp_path, "--policy", policy, "--memory", "256MiB")
    try:
        procs = {m: subprocess.Popen(
            [salus_cli(), "run", "--socket", daemon.socket, "--name", m, "--stats",
             str(tmp_path / f"{m}.stats.json"), "--", sys.executable, str(THIRD_PARTY),
             "--model", m, "--steps", str(steps), "--out", str(tmp_path / f"{m}.json")],
            stderr=subprocess.PIPE, text=True) for m in models}
        for m, p in procs.items():
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, f"{m}: {err}"
    finally:
        daemon.stop()
    for m in models:
        out = tmp_path / f"alone-{m}.json"
        subprocess.run([sys.executable, str(THIRD_PARTY), "--model", m, "--steps", str(steps),
                        "--out", str(out)], check=True, timeout=240)
        shared = json.loads((tmp_path / f"{m}.json").read_text())
        assert shared["weights"] == json.loads(out.read_text())["weights"], m  # bitwise
        stats = json.loads((tmp_path / f"{m}.stats.json").read_text())
        assert stats["iterations"] == steps + 1, (m, stats)  # the first step's turn too
        assert stats["memory"]["ephemeral"]["peak"] > 0, (m, stats["memory"])


TIGHT_RUNS = int(os.environ.get("SALUS_TIGHT_RUNS", "1"))  # issue 34 asks 5; CI runs 1
POLICIES = ["fair", "pack", "memory_aware", "fifo", "srtf", "priority"]
PAGE = 2 << 20


def third_party_run(socket: str, model: str, folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [salus_cli(), "run", "--socket", socket, "--name", model, "--stats",
         str(folder / f"{model}.stats.json"), "--", sys.executable, str(THIRD_PARTY),
         "--model", model, "--steps", "4", "--out", str(folder / f"{model}.json")],
        stderr=subprocess.PIPE, text=True)


def third_party_shared(folder: Path, policy: str, memory: int,
                       hog: bool = False) -> dict[str, tuple[int, str]]:
    """The three third-party scripts (and a script that cannot fit) as processes of one salusd:
    each one's exit code and the last line of its stderr."""
    folder.mkdir(parents=True)
    daemon = Daemon(folder, "--policy", policy, "--memory", f"{memory >> 20}MiB")
    try:
        procs = {m: third_party_run(daemon.socket, m, folder) for m in THIRD_PARTY_MODELS}
        if hog:
            procs["hog"] = subprocess.Popen(
                [salus_cli(), "run", "--socket", daemon.socket, "--name", "hog", "--",
                 sys.executable, str(Path(__file__).with_name("hog_train.py")),
                 "--bytes", str(2 * memory)], stderr=subprocess.PIPE, text=True)
        ends = {}
        for m, p in procs.items():
            _, err = p.communicate(timeout=300)
            ends[m] = (p.returncode, (err.strip().splitlines() or [""])[-1])
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()
    return ends


THIRD_PARTY_MODELS = ["mobilenet", "vit", "gpt2"]


@pytest.fixture(scope="module")
def tight_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, str]]:
    """1.05x the floor across processes, in whole pages: the sum of each script's persistent
    peak and the largest ephemeral peak, measured on a generous daemon; and each script's
    weights alone, in plain PyTorch."""
    for library in ("torchvision", "timm", "transformers"):
        pytest.importorskip(library)
    folder = tmp_path_factory.mktemp("generous") / "run"
    ends = third_party_shared(folder, "fair", 512 << 20)
    assert all(code == 0 for code, _ in ends.values()), ends
    stats = {m: json.loads((folder / f"{m}.stats.json").read_text()) for m in THIRD_PARTY_MODELS}
    floor = (sum(s["memory"]["persistent"]["peak"] for s in stats.values()) +
             max(s["memory"]["ephemeral"]["peak"] for s in stats.values()))
    alone_weights = {}
    for m in THIRD_PARTY_MODELS:
        out = folder / f"alone-{m}.json"
        subprocess.run([sys.executable, str(THIRD_PARTY), "--model", m, "--steps", "4", "--out",
                        str(out)], check=True, timeout=240)
        alone_weights[m] = json.loads(out.read_text())["weights"]
    return -(-int(floor * 1.05) // PAGE) * PAGE, alone_weights


@pytest.mark.parametrize("policy", POLICIES)
def test_third_party_scripts_share_a_tight_gpu_across_processes(
        policy: str, tight_processes: tuple[int, dict[str, str]], tmp_path: Path) -> None:
    """Issue 34, item 1: at 1.05x the floor the three scripts all train, bitwise as alone, under
    every policy (before, the smallest working memory was not repeatable: 360 MiB passed once and
    failed on a rerun, each failure a script's first step, which ran outside any turn)."""
    memory, alone_weights = tight_processes
    for run in range(TIGHT_RUNS):
        folder = tmp_path / f"run{run}"
        ends = third_party_shared(folder, policy, memory)
        for m in THIRD_PARTY_MODELS:
            assert ends[m][0] == 0, f"{policy} at {memory >> 20} MiB, run {run}: {m}: {ends[m]}"
            assert json.loads((folder / f"{m}.json").read_text())["weights"] == \
                alone_weights[m], (policy, run, m)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_script_that_cannot_fit_fails_alone_across_processes(
        policy: str, tight_processes: tuple[int, dict[str, str]], tmp_path: Path) -> None:
    """Issue 34, item 2: beside the three, a script whose step needs twice the device fails with
    salus.OutOfMemory, and only it; the others end bitwise as alone (before, under memory_aware
    ConvNeXt died too in 4 of 4 runs and BERT in 2 of 4)."""
    memory, alone_weights = tight_processes
    for run in range(TIGHT_RUNS):
        folder = tmp_path / f"run{run}"
        ends = third_party_shared(folder, policy, memory, hog=True)
        code, last = ends["hog"]
        assert code != 0 and last.startswith("salus.errors.OutOfMemory:"), (policy, run, last)
        for m in THIRD_PARTY_MODELS:
            assert ends[m][0] == 0, f"{policy}, run {run}: {m} failed beside the hog: {ends[m]}"
            assert json.loads((folder / f"{m}.json").read_text())["weights"] == \
                alone_weights[m], (policy, run, m)


def test_a_script_over_its_limit_fails_alone_with_salus_out_of_memory(traced: Daemon,
                                                                      tmp_path: Path) -> None:
    # The MLP's first layer alone is 1.5 MiB.
    tiny = salus_run(traced.socket, "tiny", "mlp", tmp_path / "tiny.json", "--limit", "256KiB")
    others = [salus_run(traced.socket, f"job-{m}", m, tmp_path / f"{m}.json")
              for m in ("cnn", "small")]
    _, err = tiny.communicate(timeout=180)
    assert tiny.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("salus.errors.OutOfMemory:"), err
    assert "'tiny'" in last and "262144" in last, last
    for m, p in zip(("cnn", "small"), others):
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert json.loads((tmp_path / f"{m}.json").read_text())["weights"] == \
            alone(tmp_path, m)["weights"]


def test_a_killed_script_costs_the_others_nothing(traced: Daemon, tmp_path: Path) -> None:
    victim = salus_run(traced.socket, "victim", "cnn", tmp_path / "victim.json", steps=100000)
    survivors = {m: salus_run(traced.socket, f"job-{m}", m, tmp_path / f"{m}.json", steps=30)
                 for m in ("mlp", "small")}
    deadline = time.monotonic() + 60
    while not any(line.startswith("victim") and int(line.split()[3]) >= 2
                  for line in daemon_status(traced).splitlines()):
        assert time.monotonic() < deadline, daemon_status(traced)
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    for m, p in survivors.items():
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, f"{m}: {err}"
        assert json.loads((tmp_path / f"{m}.json").read_text())["weights"] == \
            alone(tmp_path, m, 30)["weights"]
    assert "victim" not in daemon_status(traced)


def test_salus_run_starts_a_daemon_when_none_answers(tmp_path: Path) -> None:
    socket = str(tmp_path / "own.sock")
    env = {**os.environ, "SALUS_SOCKET": socket}
    out = tmp_path / "out.json"
    done = subprocess.run([salus_cli(), "run", "--backend", "sim", "--memory", "256MiB", "--",
                           sys.executable, str(SCRIPT), "--model", "small", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=180)
    try:
        assert done.returncode == 0, done.stderr
        assert json.loads(out.read_text())["weights"] == alone(tmp_path, "small")["weights"]
        # It outlives the command, for the next one to reuse.
        status = subprocess.run([salus_cli(), "status", "--socket", socket], capture_output=True,
                                text=True, timeout=10)
        assert status.returncode == 0 and "policy" in status.stdout, status.stderr
        # The query is not one of the daemon's processes: the sessions table is empty.
        sessions = status.stdout.split("session ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
        assert sessions == [], status.stdout
    finally:
        pid = int(Path(socket + ".lock").read_text())
        os.kill(pid, signal.SIGTERM)
    # Stopped cleanly, it leaves nothing beside its socket (its lock file and log included).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # until the daemon has exited
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("own.sock"))
    assert left == [], left


def test_bad_input_is_said_before_anything_runs(tmp_path: Path) -> None:
    for args, says in [(["run", "--limit", "lots", "--", "true"], "--limit"),
                       (["run", "--socket", str(tmp_path / "s.sock"), "--backend", "sim"],
                        "no command")]:
        done = subprocess.run([salus_cli(), *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)


def test_what_would_fail_later_fails_first_and_starts_nothing(tmp_path: Path) -> None:
    socket = tmp_path / "never.sock"
    for args, says in [
            (["--", "pythn", "train.py"], "cannot run 'pythn': no such command"),
            (["--stats", str(tmp_path / "missing" / "stats.json"), "--", sys.executable, "-c",
              "pass"], "does not exist or is not writable")]:
        done = subprocess.run([salus_cli(), "run", "--socket", str(socket), "--backend", "sim",
                               *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert done.stderr.count("salus run:") == 1, done.stderr
        assert not socket.exists() and not Path(f"{socket}.lock").exists(), \
            "a daemon was started for a command that cannot run"


def test_a_daemon_that_refuses_its_settings_is_said_at_once(tmp_path: Path) -> None:
    socket = tmp_path / "bad.sock"
    started = time.monotonic()
    done = subprocess.run([salus_cli(), "run", "--socket", str(socket), "--backend", "sim",
                           "--policy", "no-such-policy", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "exited with status" in done.stderr and "no-such-policy" in done.stderr, done.stderr
    # Said when the daemon exits, not after the 10 s a slow daemon is given to answer.
    assert time.monotonic() - started < 8, done.stderr


def test_settings_a_running_daemon_ignores_are_said(traced: Daemon) -> None:
    done = subprocess.run([salus_cli(), "run", "--socket", traced.socket, "--memory", "8GiB",
                           "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--memory 8GiB ignored: a salusd already runs" in done.stderr, done.stderr


def test_a_job_is_named_after_its_script_module_or_code() -> None:
    from salus.cli import default_job_name

    assert default_job_name(["python3", "train.py", "--lr", "1"]) == "train"
    assert default_job_name(["/usr/bin/python3.11", "-u", "-m", "pkg.train"]) == "pkg.train"
    assert default_job_name(["python", "-c", "print(1)"]) == "python -c"
    assert default_job_name(["./run_training.sh"]) == "run_training.sh"


def test_help_shows_an_example() -> None:
    done = subprocess.run([salus_cli(), "run", "--help"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and "salus run -- python train.py" in done.stdout, done.stdout
    assert "``" not in done.stdout


@pytest.mark.parametrize("mode,kind,iterations", [
    ("training", "training", 5),  # its own marks, not the optimizer steps' as well
    ("requests", "inference", 5),  # a request an iteration
    ("long", "inference", 0),  # no marks: never waits for a turn, its memory all persistent
])
def test_a_script_that_marks_its_own_iterations_keeps_its_marks(
        traced: Daemon, tmp_path: Path, mode: str, kind: str, iterations: int) -> None:
    stats = tmp_path / "stats.json"
    done = subprocess.run(
        [salus_cli(), "run", "--socket", traced.socket, "--kind", kind, "--stats", str(stats),
         "--", sys.executable, str(Path(__file__).with_name("marking_script.py")), "--mode", mode],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(stats.read_text())["iterations"] == iterations


def test_salus_iteration_without_a_shared_job_says_so() -> None:
    done = subprocess.run([sys.executable, "-c", "import salus; salus.iteration()"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "InvalidArgument" in done.stderr and "salus run" in done.stderr, done.stderr


def test_a_python_without_salus_does_not_run_the_script_unshared(traced: Daemon,
                                                                 tmp_path: Path) -> None:
    # The interpreter this venv was made from cannot import salus: the script must not run as
    # if it shared.
    base = Path(sys.base_prefix) / "bin" / Path(sys.executable).name
    if not base.exists() or sys.prefix == sys.base_prefix:  # not in a venv: base is this one
        pytest.skip("no base interpreter apart from this one")
    marker = tmp_path / "ran"
    done = subprocess.run(
        [salus_cli(), "run", "--socket", traced.socket, "--", str(base), "-c",
         f"open({str(marker)!r}, 'w')"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and not marker.exists()
    assert "salus run: cannot set up Salus" in done.stderr, done.stderr
