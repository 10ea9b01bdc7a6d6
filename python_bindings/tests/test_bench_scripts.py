"""salus-bench's scripts mode: unmodified PyTorch scripts as processes on one simulated GPU, one
at a time, all at once without Salus, and under salusd (``unmodified_scripts`` at small scale)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from salus.bench import InputError, ModeNotSupported, run

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "benchmarks" / "experiments"
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _experiments_from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SALUS_BENCH_EXPERIMENTS", str(EXPERIMENTS))


def test_unmodified_scripts_at_small_scale(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    outcome = run("unmodified_scripts", "scripts", out=tmp_path, scale="small")
    summary = json.loads((tmp_path / "summary.json").read_text())
    labels = [v["label"] for v in summary["variants"]]
    assert labels == ["one at a time", "all at once, no Salus", "salusd fair"]
    for f in ("jobs.csv", "summary.md", "bars.png", "timeline.png", "jct_cdf.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    gpu = 128 * MiB
    by_label = {r.variant.label: r for r in outcome.summary.results}
    for label, r in by_label.items():
        assert [j.name for j in r.jobs] == ["cnn", "transformer", "lstm"]
        assert 0 < r.devices[0].peak_memory <= gpu, label
        assert all(0 <= m <= gpu for m in r.timelines[0].memory), label
        assert (tmp_path / r.trace).stat().st_size > 0
        for j in r.jobs:
            if j.error:
                # Only the arm without Salus may lose a script, and only to memory that the
                # others keep.
                assert label == "all at once, no Salus", (label, j.error)
                assert "OutOfMemory" in j.error and "--reclaim never" in j.error, j.error
                continue
            assert j.iterations == 4, (label, j)  # [scale.small] steps
            assert 0 < j.first_start < j.finish, (label, j)
    for label in ("one at a time", "salusd fair"):
        m = outcome.summary.metrics[label]
        assert not m.get("failed_jobs"), label
        # The scripts under salusd took turns and still ended bitwise where they end alone.
        assert m["weights_as_alone"] == 3, label
    # One at a time runs each script after the one before has exited.
    alone = sorted(by_label["one at a time"].jobs, key=lambda j: j.first_start)
    for before, after in zip(alone, alone[1:]):
        assert before.finish <= after.first_start
    # Under salusd the scripts took turns: each waited for the others' (a step's worth at least:
    # its statistics count the wait for the daemon's turn).
    assert all(j.waiting > 0.02 for j in by_label["salusd fair"].jobs), by_label["salusd fair"]
    notes = "\n".join(outcome.summary.notes)
    assert "--reclaim never" in notes and "training time alone" in notes


def test_scripts_mode_runs_only_experiments_of_scripts(tmp_path: Path) -> None:
    with pytest.raises(ModeNotSupported) as caught:
        run("jct", "scripts", out=tmp_path / "out", scale="small")
    assert caught.value.mode == "scripts" and "[scripts]" in caught.value.reason
    assert not (tmp_path / "out").exists()


def _experiment(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\ndescription = "d"\n[cluster]\ngpu_memory = "64MiB"\n' + body)
    return path


def test_a_missing_script_names_its_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = _experiment(tmp_path, '[scripts]\n[[scripts.script]]\nname = "a"\n'
                                 'path = "nowhere.py"\n')
    with pytest.raises(InputError) as caught:
        run(str(path), "scripts", out=tmp_path / "out")
    assert caught.value.line == 8 and "no such file" in caught.value.reason


def test_an_unknown_salusd_policy_names_its_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, '[scripts]\npolicies = ["fair", "fastest"]\n'
                                 '[[scripts.script]]\nname = "a"\npath = "a.py"\n')
    with pytest.raises(InputError) as caught:
        run(str(path), "scripts", out=tmp_path / "out")
    assert caught.value.line == 6 and "fastest" in caught.value.reason


def test_the_scripts_cpus_default_to_one_this_process_may_use(tmp_path: Path) -> None:
    """A machine that pins its jobs may not give CPU 0: the default is the first CPU allowed,
    and a CPU not allowed is refused, naming its line."""
    import os

    from salus.bench.experiment import load_experiment
    from salus.bench.scripts_mode import ScriptsPlan

    (tmp_path / "a.py").write_text("")
    script = '[[scripts.script]]\nname = "a"\npath = "a.py"\n'
    plan = ScriptsPlan.of(load_experiment(_experiment(tmp_path, "[scripts]\n" + script)))
    assert plan.cpus == (min(os.sched_getaffinity(0)),)
    beyond = max(os.sched_getaffinity(0)) + 1
    path = _experiment(tmp_path, f"[scripts]\ncpus = [{beyond}]\n" + script)
    with pytest.raises(InputError) as caught:
        ScriptsPlan.of(load_experiment(path))
    assert caught.value.line == 6 and "are not among" in caught.value.reason
