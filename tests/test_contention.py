"""A busy machine cannot fool the search (autotune/contention.py, benchmark/policy.py, study/doubt.py): the kernel's
counters say what other processes took during each timed run, a disturbed run is measured again and not counted,
a benchmark no run of which was quiet is doubted, and a doubted trial stays off the front and out of what the search
learns, while the search goes on."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from test_study import ScriptedBackend, _settings, _study

import autotune.benchmark.policy as policy_module
from autotune.benchmark.bench import stopped, summarize
from autotune.benchmark.policy import RunPolicy, timed_runs
from autotune.config.deploy import DeployConfig
from autotune.contention import DOUBT_CORES, doubt, load_between, measured_quietly, sample
from autotune.results.front import pareto_trials
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.space.serving_knobs import offline_space
from autotune.study.loop import run_search
from autotune.study.trial_limit import trial_limit

_STAT = "cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4\n"


def _stat(tmp_path: Path, name: str, **ticks) -> Path:
    path = tmp_path / name
    path.write_text(_STAT.format(**{"user": 0, "system": 0, "idle": 0, "steal": 0, **ticks}))
    return path


def test_the_counters_read_others_busy_time_in_cores_less_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    before = sample(_stat(tmp_path, "a", user=1000, idle=1000))
    after = sample(_stat(tmp_path, "b", user=1300, idle=1100, steal=0))  # 4 s of ticks at 100 Hz over 2 CPUs
    # Every busy tick is another process's unless this one's own CPU time moved (it did not, much, meanwhile).
    load = load_between(before, after)
    assert load["others_cores"] == pytest.approx(1.5, abs=0.05) and load["steal_share"] == 0.0
    assert "other processes took 1.49" in doubt(load)  # less two ticks: the counters' rounding
    assert doubt({"others_cores": DOUBT_CORES / 2, "steal_share": 0.0}) is None
    assert "hypervisor" in doubt({"others_cores": 0.0, "steal_share": 0.2})
    assert sample(tmp_path / "missing") is None and load_between(None, after) == {} and doubt({}) is None


def test_a_run_of_a_few_ticks_is_not_doubted_for_a_ticks_rounding(tmp_path, monkeypatch):
    """Two busy ticks over a 15 ms run (3 ticks over 2 CPUs at 100 Hz) are the counters' rounding, not another
    process: read as such they were 1.33 cores, and a tiny model's OpenVINO trials were kept off the front."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    before = sample(_stat(tmp_path, "a", user=1000, idle=1000))
    after = sample(_stat(tmp_path, "b", user=1002, idle=1001))
    assert load_between(before, after)["others_cores"] == 0.0


def test_a_busy_loop_beside_a_measurement_is_seen():
    """A real process spinning on one core while this one sleeps: the counters see about a core's worth."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)  # past its interpreter's start
        before = sample()
        time.sleep(1.5)
        load = load_between(before, sample())
    finally:
        busy.kill()
        busy.wait()
    assert load["others_cores"] >= 0.8, load
    assert doubt(load) is not None


def _scripted_loads(monkeypatch, loads: list[dict]) -> None:
    feed = iter(loads)
    monkeypatch.setattr(policy_module, "load_between", lambda before, after: next(feed))


QUIET, BUSY = {"others_cores": 0.02, "steal_share": 0.0}, {"others_cores": 1.0, "steal_share": 0.0}


def test_a_disturbed_run_is_measured_again_and_not_counted(monkeypatch):
    _scripted_loads(monkeypatch, [BUSY, QUIET, QUIET])
    speeds = iter([11.0, 110.0, 112.0])
    logs: list[str] = []
    runs, stop = timed_runs(lambda: {"throughput_tok_s": next(speeds)}, RunPolicy(), logs.append)
    assert [r["throughput_tok_s"] for r in runs] == [110.0, 112.0] and stop.startswith("spread known")
    assert any("11.0 tok/s, not counted: the machine was busy" in line for line in logs)
    result = {**summarize(runs), **stopped(stop)}
    assert "doubt" not in result and result["others_cores_max"] == 0.02


def test_a_benchmark_no_run_of_which_was_quiet_is_doubted(monkeypatch):
    _scripted_loads(monkeypatch, [BUSY] * 3)
    runs, stop = timed_runs(lambda: {"throughput_tok_s": 11.0}, RunPolicy(max_repeats=3), lambda line: None)
    result = {**summarize(runs), **stopped(stop)}
    assert len(runs) == 3 and "the machine was busy" in result["doubt"] and result["others_cores_max"] == 1.0


def test_a_doubted_cache_figure_is_measured_again_then_left_uncached(monkeypatch):
    import autotune.contention as contention

    loads = iter([BUSY, QUIET])
    monkeypatch.setattr(contention, "load_between", lambda before, after: next(loads))
    calls = []
    result, doubted = measured_quietly(lambda: calls.append(1) or len(calls), "peaks")
    assert (result, doubted) == (2, None)
    loads = iter([BUSY, BUSY])
    result, doubted = measured_quietly(lambda: 7, "peaks")
    assert result == 7 and "busy" in doubted


class _BusyFirst(ScriptedBackend):
    """The first trial's every timed run was disturbed: its figure a tenth of what the machine gives."""

    def run(self, job, timeout_s):
        result = super().run(job, timeout_s)
        if len(self.jobs) == 1 and result.bench is not None:
            result.bench = {**result.bench, "throughput_tok_s": result.bench["throughput_tok_s"] / 10,
                            "doubt": "the machine was busy: other processes took 1.00 cores on average"}
        return result


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))


def test_a_doubted_trial_stays_off_the_front_and_out_of_what_the_search_learns(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    study, backend = _study(tmp_path), _BusyFirst()
    run_search(_settings(tmp_path, 6), space, backend, study)
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.COMPLETE and first.user_attrs["bench"]["doubt"]
    assert first.constraints == {"quiet_machine": 1.0}
    assert len(study.trials) == 6  # the search went on past it
    front = pareto_trials(study)
    assert front and first.number not in {t.number for t in front}
    # The trial limits read only the trials it trusts: a doubted trial's long wall time does not raise them.
    first.user_attrs["trial_seconds"] = 10_000.0
    trusted = [t for t in study.trials if t.number != first.number]
    workload, config = _settings(tmp_path, 6).workload, DeployConfig()
    assert trial_limit(None, config, workload, None, [first, *trusted], repeats=3, repeat_time_s=60) == \
        trial_limit(None, config, workload, None, trusted, repeats=3, repeat_time_s=60)
