"""salus-bench ray mode: the same trials one per GPU, on Ray's fractional GPUs and with Salus on
Ray, on a local Ray cluster of simulated GPUs (the mode starts and stops it); and the clear
errors when an experiment or the machine cannot run it.

The trials run in Ray's worker processes, which import the installed ``salus`` package: after
editing salus/bench, reinstall it (pip install --no-build-isolation --no-deps .).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from salus.bench import InputError, ModeNotSupported, run
from salus.bench.cli import main

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "benchmarks" / "experiments"
ONE, FRACTIONAL, SALUS = "one-per-GPU", "Ray fractional 0.25", "Salus on Ray (pack)"
PROCESSES = "Salus on Ray, trial processes (pack)"


@pytest.fixture(autouse=True)
def _experiments_from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SALUS_BENCH_EXPERIMENTS", str(EXPERIMENTS))


def test_the_arms_run_the_same_trials(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    outcome = run("ray_trials", "ray", out=tmp_path, scale="small", seed=1)
    for f in ("jobs.csv", "summary.json", "summary.md", "bars.png", "jct_cdf.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    results = {r.variant.label: r for r in outcome.summary.results}
    assert list(results) == [ONE, FRACTIONAL, SALUS, PROCESSES]
    names = {label: sorted(j.name for j in r.jobs) for label, r in results.items()}
    assert len(names[ONE]) == 8
    assert names[ONE] == names[FRACTIONAL] == names[SALUS] == names[PROCESSES]

    failed = {label: [j for j in r.jobs if j.error] for label, r in results.items()}
    assert failed[ONE] == [] and failed[SALUS] == [] and failed[PROCESSES] == []
    assert failed[FRACTIONAL], "four trials per GPU by count should not all fit"
    assert all("OutOfMemory" in j.error for j in failed[FRACTIONAL])
    for label, r in results.items():
        finished = [j for j in r.jobs if not j.error]
        assert all(j.iterations == 6 and j.finish > j.first_start >= 0 for j in finished), label
        assert r.extra["failed_jobs"] == len(failed[label])
        assert len(r.devices) == 2 and all(d.busy > 0 for d in r.devices)
    assert results[ONE].extra["peak_trials_per_gpu"] == 1
    assert results[FRACTIONAL].extra["peak_trials_per_gpu"] == 4  # Ray's count, no memory look
    # Trials as processes of salusd: packed by the same rule, inside the GPU's memory (the
    # daemon's own count of the pages it handed out at once).
    assert results[PROCESSES].extra["peak_trials_per_gpu"] >= 2
    assert all(0 < d.peak_memory <= 16 << 30 for d in results[PROCESSES].devices)

    metrics = outcome.summary.metrics
    assert metrics[SALUS]["makespan"] < metrics[ONE]["makespan"]
    assert metrics[SALUS]["utilization"] > metrics[ONE]["utilization"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["baseline"] == ONE and summary["mode"] == "ray"
    md = (tmp_path / "summary.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| variant |"))
    assert all(c in header for c in ("| failed |", "| makespan |", "| GPU utilization |"))
    assert "CUDA context" in md


def test_an_experiment_without_a_ray_table_says_why(tmp_path: Path) -> None:
    with pytest.raises(ModeNotSupported) as caught:
        run("hyperparam", "ray", out=tmp_path / "out", scale="small")
    e = caught.value
    assert (e.experiment, e.mode) == ("hyperparam", "ray")
    assert "[ray]" in e.reason and e.reason in e.message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["simulate", "run", "torch"])
def test_ray_trials_runs_only_in_ray_mode(mode: str, tmp_path: Path) -> None:
    with pytest.raises(ModeNotSupported, match="ray mode"):
        run("ray_trials", mode, out=tmp_path / "out", scale="small")


def test_without_ray_the_mode_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ModeNotSupported) as caught:
        run("ray_trials", "ray", out=tmp_path / "out", scale="small")
    assert "Ray is not importable" in caught.value.reason
    assert not (tmp_path / "out").exists()


def test_a_bad_ray_key_names_its_line(tmp_path: Path) -> None:
    text = (EXPERIMENTS / "ray_trials.toml").read_text()
    path = tmp_path / "bad.toml"
    path.write_text(text.replace("fraction = 0.25", "fraction = 1.5"))
    with pytest.raises(InputError) as caught:
        run(str(path), "ray", out=tmp_path / "out", scale="small")
    e = caught.value
    assert e.field == "ray.fraction" and "at most 1" in e.reason
    assert e.line == text.splitlines().index("fraction = 0.25") + 1


def test_a_policy_the_workers_do_not_know_is_refused(tmp_path: Path) -> None:
    import salus

    class _Policy(salus.Policy):  # type: ignore[misc]
        def key(self, job: object) -> float:
            return 0.0

    salus.register_policy("ray_mode_test_policy", _Policy)  # known here, not in Ray's workers
    try:
        with pytest.raises(InputError, match="not a built-in policy"):
            run("ray_trials", "ray", out=tmp_path / "out", scale="small",
                policies=["ray_mode_test_policy"])
    finally:
        salus.unregister_policy("ray_mode_test_policy")
    assert not (tmp_path / "out").exists()


def test_the_cli_lists_ray_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "ray" in capsys.readouterr().out
    assert main(["ray", "hyperparam", "--scale", "small"]) == 2
    assert "has no [ray] table" in capsys.readouterr().err
