"""salus-bench: every experiment at small scale in each mode it supports, determinism of the
simulator under a seed, one clear error per kind of bad input, and the command line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import salus
from salus.bench import InputError, ModeNotSupported, run
from salus.bench.cli import main
from salus.bench.experiment import find_experiment

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "benchmarks" / "experiments"
WORKLOADS = REPO / "benchmarks" / "data" / "salus_workloads.csv"

# The modes each experiment runs in; the others must say "not supported".
SUPPORTED = {
    "jct": ("simulate", "run", "torch"),
    "hyperparam": ("simulate", "run", "torch"),
    "inference": ("simulate", "run", "torch"),
    "colocation": ("simulate", "run"),
    "cluster": ("simulate",),
    "harvesting": ("run",),  # the C++ study (salus_harvest_study); tested on its own below
    "ray_trials": (),  # ray mode only: test_bench_ray.py
    "unmodified_scripts": (),  # scripts mode only: test_bench_scripts.py
}
MODES = ("simulate", "run", "torch")


def _needs(mode: str) -> None:
    if mode == "torch":
        pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _experiments_from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SALUS_BENCH_EXPERIMENTS", str(EXPERIMENTS))


def test_the_experiments_are_those_listed() -> None:
    assert sorted(p.stem for p in EXPERIMENTS.glob("*.toml")) == sorted(SUPPORTED)


@pytest.mark.parametrize("name,mode", [(n, m) for n, modes in SUPPORTED.items() for m in modes
                                       if n != "harvesting"])
def test_each_experiment_runs_at_small_scale(name: str, mode: str, tmp_path: Path) -> None:
    _needs(mode)
    outcome = run(name, mode, out=tmp_path, scale="small", seed=2)
    plots = ["bars.png", "timeline.png"]
    plots.append("latency_cdf.png" if name == "inference" else "jct_cdf.png")
    for f in ("jobs.csv", "summary.json", "summary.md", *plots):
        assert (tmp_path / f).stat().st_size > 0, f
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["experiment"] == name and summary["mode"] == mode
    labels = [v["label"] for v in summary["variants"]]
    assert labels and len(labels) == len(set(labels))
    rows = (tmp_path / "jobs.csv").read_text().splitlines()
    jobs = len(outcome.summary.results[0].jobs)
    assert len(rows) == 1 + sum(len(r.jobs) for r in outcome.summary.results)
    for variant in summary["variants"]:
        m = variant["metrics"]
        assert m["jobs"] == jobs
        assert m["makespan"] > 0
        assert 0 < m["utilization"] <= 1.0 + 1e-9
    for r in outcome.summary.results:
        for j in r.jobs:
            if j.error:  # run mode: a job the runtime refused memory (reported, not a failure)
                assert "OutOfMemory" in j.error
                continue
            assert j.finish >= j.first_start >= j.arrival - 1e-9, j
            assert j.iterations > 0
    if mode != "simulate":
        traces = list(tmp_path.glob("trace-*.json"))
        assert len(traces) == len(labels)
        assert "traceEvents" in json.loads(traces[0].read_text())
    md = (tmp_path / "summary.md").read_text()
    assert f"# {name} ({mode}" in md
    paper = summary["paper"]
    if paper is not None:
        assert "(paper: " in md  # the paper's number beside ours in the table
        assert paper["ours"] is not None


@pytest.mark.parametrize("name,mode", [(n, m) for n, modes in SUPPORTED.items()
                                       for m in MODES if m not in modes])
def test_a_mode_an_experiment_cannot_run_in_says_why(name: str, mode: str,
                                                     tmp_path: Path) -> None:
    with pytest.raises(ModeNotSupported) as caught:
        run(name, mode, out=tmp_path / "out", scale="small")
    e = caught.value
    assert (e.experiment, e.mode) == (name, mode)
    assert e.reason and e.reason in e.message
    assert not (tmp_path / "out").exists()  # refused before writing anything


# --- harvesting: run mode runs the C++ study binary ---------------------------------------------

def _harvest_study_or_skip() -> None:
    """The binary comes from the CMake build (scripts/test.sh builds it before pytest)."""
    from salus.bench.experiment import load_experiment
    from salus.bench.harvest import find_binary

    try:
        find_binary(load_experiment(find_experiment("harvesting")))
    except ModeNotSupported as e:
        pytest.skip(e.reason)


def test_harvesting_runs_the_study_and_peer_first_beats_host_only(tmp_path: Path) -> None:
    _harvest_study_or_skip()
    outcome = run("harvesting", "run", out=tmp_path, scale="small")
    for f in ("jobs.csv", "summary.json", "summary.md", "harvest_bars.png", "bars.png",
              "harvest_study.json", "iterations.csv"):
        assert (tmp_path / f).stat().st_size > 0, f
    configs = ("no-spill", "host-only", "peer-first")
    for config in configs:
        trace = json.loads((tmp_path / f"trace-{config}.json").read_text())
        assert any(e.get("cat") == "iteration" for e in trace["traceEvents"]), config
    rows = (tmp_path / "jobs.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * len(configs)  # X and Y per configuration
    assert all(r.split(",")[-5] == "3" for r in rows[1:])  # small scale: 3 iterations each
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [v["label"] for v in summary["variants"]] == list(configs)
    assert summary["baseline"] == "no-spill"
    m = {v["label"]: v["metrics"] for v in summary["variants"]}
    # What the study shows every time: spilling costs, and to peers less than to the host.
    # (Over three runs at small scale peer-first was 2.0-2.3x faster than host-only per job.)
    for job in ("X", "Y"):
        assert m["peer-first"][f"iteration_time_{job}"] < m["host-only"][f"iteration_time_{job}"]
        assert m["no-spill"][f"iteration_time_{job}"] < m["peer-first"][f"iteration_time_{job}"]
    assert m["peer-first"]["speedup_over_host_only"] > 1.2
    assert m["host-only"]["moved_bytes_local_to_host"] > 0
    assert m["peer-first"]["moved_bytes_local_to_peer"] > 0
    assert "moved_bytes_local_to_peer" not in m["no-spill"]
    paper = summary["paper"]
    assert paper["value"] == 2.71 and paper["variant"] == "peer-first"
    assert paper["ours"] == pytest.approx(m["peer-first"]["speedup_over_host_only"])
    md = (tmp_path / "summary.md").read_text()
    assert "| peer-first |" in md and "(paper: up to 2.71x)" in md
    assert "prefetch hit rate" in md and "local → peer" in md
    assert "divided by 50" in md and "fixed sleep" in md  # the simulation's assumptions
    assert outcome.summary.notes and outcome.files[:3] == ["jobs.csv", "summary.json",
                                                            "summary.md"]


def test_harvesting_without_the_binary_says_how_to_build_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SALUS_HARVEST_STUDY", str(tmp_path / "missing"))
    with pytest.raises(ModeNotSupported) as caught:
        run("harvesting", "run", out=tmp_path / "out", scale="small")
    e = caught.value
    assert (e.experiment, e.mode) == ("harvesting", "run")
    assert "SALUS_HARVEST_STUDY" in e.reason and str(tmp_path / "missing") in e.reason
    assert "cmake -S . -B build && cmake --build build --target salus_harvest_study" in e.reason
    assert not (tmp_path / "out").exists()  # refused before writing anything


@pytest.mark.parametrize("mode,why", [("simulate", "memory tiers"), ("torch", "spilling")])
def test_harvesting_in_simulate_or_torch_mode_says_why_not(mode: str, why: str,
                                                           tmp_path: Path) -> None:
    with pytest.raises(ModeNotSupported) as caught:
        run("harvesting", mode, out=tmp_path / "out", scale="small")
    assert (caught.value.experiment, caught.value.mode) == ("harvesting", mode)
    assert why in caught.value.reason


def test_a_failing_harvest_study_raises_with_command_exit_code_and_stderr(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from salus.bench.harvest import StudyFailed

    fake = tmp_path / "salus_harvest_study"
    fake.write_text("#!/bin/sh\necho 'salus_harvest_study: the window never closed' >&2\n"
                    "exit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SALUS_HARVEST_STUDY", str(fake))
    with pytest.raises(StudyFailed) as caught:
        run("harvesting", "run", out=tmp_path / "out", scale="small")
    e = caught.value
    assert e.returncode == 3 and e.command[0] == str(fake.resolve())
    assert e.command[e.command.index("--iterations") + 1] == "3"
    assert "window never closed" in e.stderr_tail and "window never closed" in e.message
    assert isinstance(e, salus.Error)


def _simulate_files(tmp_path: Path, seed: int, tag: str) -> tuple[bytes, bytes]:
    out = tmp_path / tag
    run("jct", "simulate", out=out, scale="small", seed=seed)
    return (out / "jobs.csv").read_bytes(), (out / "summary.json").read_bytes()


def test_simulate_is_deterministic_under_a_seed_and_changes_with_another(tmp_path: Path) -> None:
    _needs("simulate")
    first = _simulate_files(tmp_path, 7, "a")
    again = _simulate_files(tmp_path, 7, "b")
    other = _simulate_files(tmp_path, 8, "c")
    assert first == again
    assert first[0] != other[0] and first[1] != other[1]


def test_the_policies_on_the_command_line_replace_the_experiments(tmp_path: Path) -> None:
    _needs("simulate")
    outcome = run("jct", "simulate", out=tmp_path, scale="small", policies=["fifo", "srtf"])
    assert [r.variant.label for r in outcome.summary.results] == ["fifo", "srtf"]
    # SRTF never makes the average completion time worse than FIFO's on one GPU.
    m = outcome.summary.metrics
    assert m["srtf"]["avg_jct"] <= m["fifo"]["avg_jct"] + 1e-9


# --- bad input: one InputError naming file, line and field ----------------------------------

def _experiment(tmp_path: Path, edit: Optional[tuple[str, str]] = None, *,
                csv: Optional[Path] = None, base: str = "jct") -> Path:
    """A copy of an experiment with one textual edit, reading ``csv`` if given."""
    text = (EXPERIMENTS / f"{base}.toml").read_text()
    if edit is not None:
        assert edit[0] in text, edit[0]
        text = text.replace(edit[0], edit[1], 1)
    if csv is not None:
        text = text.replace("[workload]\n", f"[workload]\ncsv = \"{csv}\"\n", 1)
    path = tmp_path / f"{base}-edited.toml"
    path.write_text(text)
    return path


def _line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def _raises_input_error(path: Path, tmp_path: Path, mode: str = "simulate",
                        **kwargs: object) -> InputError:
    with pytest.raises(InputError) as caught:
        run(str(path), mode, out=tmp_path / "out", scale="small", **kwargs)  # type: ignore
    assert not (tmp_path / "out").exists()
    return caught.value


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "workloads.csv"
    path.write_text("workload,jct_seconds,peak_memory_mb,iterations\n" + "\n".join(rows) + "\n")
    return path


def test_an_unknown_workload_names_the_include_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ('include = ["*_25_1min", "*_50_1min"]',
                                  'include = ["*_25_1min", "resnet51_25_1min"]'))
    e = _raises_input_error(path, tmp_path)
    assert (e.path, e.line, e.field) == (str(path), _line_of(path, "resnet51"),
                                         "scale.small.workload.include")
    assert "resnet51_25_1min" in e.reason


def test_a_malformed_csv_row_names_its_line(tmp_path: Path) -> None:
    csv = _csv(tmp_path, ["a_25_1min,60,1000,100", "b_25_1min,60,1000", "c_25_1min,60,1,1"])
    path = _experiment(tmp_path, csv=csv)
    e = _raises_input_error(path, tmp_path)
    assert (e.path, e.line, e.field) == (str(csv), 3, "(row)")
    assert "3 fields" in e.reason


def test_a_non_numeric_value_names_its_column(tmp_path: Path) -> None:
    csv = _csv(tmp_path, ["a_25_1min,60,1000,100", "b_25_1min,60,lots,100"])
    e = _raises_input_error(_experiment(tmp_path, csv=csv), tmp_path)
    assert (e.path, e.line, e.field) == (str(csv), 3, "peak_memory_mb")


@pytest.mark.parametrize("row,field", [("b_25_1min,-60,1000,100", "jct_seconds"),
                                       ("b_25_1min,60,1000,-1", "iterations")])
def test_negative_times_and_counts_are_refused(row: str, field: str, tmp_path: Path) -> None:
    csv = _csv(tmp_path, ["a_25_1min,60,1000,100", row])
    e = _raises_input_error(_experiment(tmp_path, csv=csv), tmp_path)
    assert (e.path, e.line, e.field) == (str(csv), 3, field)
    assert "negative" in e.reason


def test_a_negative_time_in_the_experiment_names_its_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ("mean_interarrival_seconds = 200.0",
                                  "mean_interarrival_seconds = -5.0"))
    e = _raises_input_error(path, tmp_path)
    assert (e.line, e.field) == (_line_of(path, "= -5.0"), "jobs.mean_interarrival_seconds")


def test_an_unknown_policy_names_its_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ('"fifo", "srtf"', '"fifo", "sjf"'))
    e = _raises_input_error(path, tmp_path)
    assert (e.path, e.line, e.field) == (str(path), _line_of(path, '"sjf"'), "compare.policies")
    assert "sjf" in e.reason and "memory_aware" in e.reason  # lists the known ones


def test_an_unknown_policy_on_the_command_line(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    assert main(["simulate", "jct", "--scale", "small", "--policies", "fifo,lottery",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("<command line>: --policies: unknown policy 'lottery'")


def test_an_unknown_placement_names_its_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ('"most_free", "pack_first"', '"most_free", "random"'),
                       base="cluster")
    e = _raises_input_error(path, tmp_path)
    assert (e.line, e.field) == (_line_of(path, '"random"'), "compare.placements")


def test_an_unknown_contention_model_names_its_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ('contention = "processor_sharing"', 'contention = "mps"'))
    e = _raises_input_error(path, tmp_path)
    assert (e.line, e.field) == (_line_of(path, '"mps"'), "compare.contention")


def test_an_unknown_key_names_its_line(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ("count = 100\n", "count = 100\ncuont = 3\n"))
    e = _raises_input_error(path, tmp_path)
    assert (e.line, e.field) == (_line_of(path, "cuont"), "jobs.cuont")
    assert "unknown key" in e.reason


def test_input_errors_come_before_a_mode_is_refused(tmp_path: Path) -> None:
    path = _experiment(tmp_path, ('"fifo", "srtf"', '"fifo", "sjf"'), base="jct")
    _raises_input_error(path, tmp_path, mode="torch")


def test_the_cli_prints_path_line_field_reason_and_exits_2(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _experiment(tmp_path, ('"fifo", "srtf"', '"fifo", "sjf"'))
    assert main(["simulate", str(path), "--scale", "small", "--quiet",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: compare\.policies: unknown policy "
                        r"'sjf' \(known: .*\)", err), err
    assert "Traceback" not in err


def test_the_cli_says_when_a_mode_is_not_supported(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    assert main(["simulate", "harvesting", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not run in mode 'simulate'" in err and "memory tiers" in err


def test_an_unknown_experiment_lists_the_known_ones() -> None:
    with pytest.raises(InputError) as caught:
        find_experiment("jtc")
    assert "jct" in caught.value.reason and caught.value.field == "EXPERIMENT"


def test_input_errors_pickle_with_their_fields() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(InputError("a.toml", 3, "jobs.count", "bad")))
    assert (e.path, e.line, e.field, e.reason) == ("a.toml", 3, "jobs.count", "bad")
    assert isinstance(e, salus.InvalidArgument) and isinstance(e, ValueError)


# --- the command line -------------------------------------------------------------------------

def test_python_m_salus_bench_help() -> None:
    done = subprocess.run([sys.executable, "-m", "salus.bench", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "simulate" in done.stdout and "torch" in done.stdout


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "salus-bench"
    if not script.exists():
        script_path = shutil.which("salus-bench")
        if script_path is None:
            pytest.skip("salus-bench is not on this environment's PATH")
        script = Path(script_path)
    done = subprocess.run([str(script), "simulate", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--scale" in done.stdout and "--policies" in done.stdout


def test_the_cli_writes_the_files_and_a_table(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    _needs("simulate")
    assert main(["simulate", "hyperparam", "--scale", "small", "--seed", "3",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "memory_aware" in out and "paper:" in out
    assert (tmp_path / "summary.md").exists()


def test_list_shows_every_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in SUPPORTED:
        assert re.search(rf"^{name}\s", out, re.M), out


def test_the_workloads_copy_is_the_shared_one() -> None:
    shared = REPO.parent / "shared" / "data" / "salus_workloads.csv"
    if not shared.exists():
        pytest.skip("no ../shared beside the checkout")
    assert WORKLOADS.read_bytes() == shared.read_bytes()
    assert os.path.getsize(REPO / "benchmarks" / "data" / "README.md") > 0


def test_failed_jobs_are_counted_and_left_out_of_completion_times() -> None:
    from salus.bench.experiment import Variant
    from salus.bench.metrics import variant_metrics
    from salus.bench.results import DeviceResult, JobResult, VariantResult

    def job(name: str, finish: float, error: str = "") -> JobResult:
        return JobResult(name, "w", "training", 0, 0.0, 0.0, finish, finish, finish, 0.0, 0.0,
                         3, error=error)

    result = VariantResult(Variant("pack", "pack", "least_loaded", 1, 1), 10.0, 0.6,
                           [job("a", 4.0), job("b", 10.0), job("c", 1.0, "OutOfMemory: ...")],
                           [DeviceResult(0, 9.0, 8.0, 8.0, 1 << 30)])
    m = variant_metrics(result)
    assert m["failed_jobs"] == 1
    assert m["avg_jct"] == pytest.approx(7.0)
    assert m["utilization"] == pytest.approx(0.8)


def test_leaving_the_baseline_out_on_the_command_line_drops_the_ratios(tmp_path: Path) -> None:
    _needs("simulate")
    outcome = run("jct", "simulate", out=tmp_path, scale="small", policies=["pack", "srtf"])
    assert outcome.summary.baseline is None and not outcome.summary.vs_baseline
    assert json.loads((tmp_path / "summary.json").read_text())["paper"]["ours"] is None
