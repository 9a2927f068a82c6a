"""What a trial costs follows the machine: its limit derives from its predicted cost, its timed runs stop on count,
spread or time, the study's time budget counts what the README says (the trials, not the set-up) for every
worker, and a trial stopped at its limit takes its whole process group with it and keeps its gate figures."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import optuna
import pytest

from autotune.backends.faults import FAULTS_ENV
from autotune.backends.isolated import run_isolated
from autotune.benchmark.policy import RunPolicy, timed_runs
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.sim.hardware import load_profile
from autotune.sim.predict import predict
from autotune.study.settings import SearchSettings
from autotune.study.trial_limit import CEILING_S, FLOOR_S, GRACE_S, predicted_seconds, trial_limit
from autotune.study.workers import _settings, settings_attr
from autotune.trial.job import Job, JobKind

SMOL = resolve_model("smollm2-135m")


def _slow(profile, factor: float):
    """The profile of a machine `factor` times slower at everything."""
    f = profile.factors
    factors = dataclasses.replace(f, compute_eff=f.compute_eff / factor, bandwidth_eff=f.bandwidth_eff / factor,
                                  eager_launch_us=f.eager_launch_us * factor, seq_step_us=f.seq_step_us * factor)
    return dataclasses.replace(profile, factors=factors)


def test_the_limit_follows_the_predicted_cost_with_a_floor_and_a_reason():
    profile = load_profile("a100-80g")  # a fixed profile: no measuring here
    config = DeployConfig(quant="none", dtype="bf16", batch_size=8)
    fast = trial_limit(SMOL, config, Workload(), profile, [], repeats=3, repeat_time_s=60)
    assert fast.seconds == FLOOR_S and fast.reason.startswith("the floor of 300 s")
    slow = trial_limit(SMOL, config, Workload(), _slow(profile, 500.0), [], repeats=3, repeat_time_s=60)
    assert 600 < slow.seconds < CEILING_S and slow.seconds == pytest.approx(2.5 * slow.predicted_s)
    assert "2.5x the predicted" in slow.reason and "bench" in slow.reason and "gate" in slow.reason
    # Past an hour, 1.5x the prediction rather than 2.5x: a long trial still fits, a hang costs less.
    slower = trial_limit(SMOL, config, Workload(), _slow(profile, 2000.0), [], repeats=3, repeat_time_s=60)
    assert slower.predicted_s > CEILING_S and slower.seconds == pytest.approx(1.5 * slower.predicted_s)
    assert slower.reason.startswith("the ceiling of")
    fixed = trial_limit(SMOL, config, Workload(), profile, [], repeats=3, repeat_time_s=60, fixed_s=900)
    assert fixed.seconds == 900 and "--trial-timeout" in fixed.reason


def test_a_machine_five_times_slower_does_not_pay_five_times_the_benchmark():
    """Timed runs stop at the repeat time: where one run takes 20 s, three are timed; at 100 s, one."""
    profile, config, workload = load_profile("a100-80g"), DeployConfig(quant="none", dtype="bf16"), Workload()
    tokens = workload.num_requests * workload.output_tokens
    factor = 1.0
    while tokens / predict(SMOL, config, workload, _slow(profile, factor)).throughput_tok_s < 20:
        factor *= 1.25
    base = predicted_seconds(SMOL, config, workload, _slow(profile, factor), 3, 60.0)["bench_s"]
    slower = predicted_seconds(SMOL, config, workload, _slow(profile, 5 * factor), 3, 60.0)["bench_s"]
    assert slower / base < 3.5, (base, slower)


def test_the_limit_learns_from_the_trials_measured_here(tmp_path):
    profile = _slow(load_profile("a100-80g"), 2000.0)
    config = DeployConfig(quant="none", dtype="bf16", batch_size=8)
    first = trial_limit(SMOL, config, Workload(), profile, [], repeats=3, repeat_time_s=60)
    ran = types.SimpleNamespace(user_attrs={"trial_seconds": 3 * first.predicted_s, "trial_limit": first.to_dict()},
                                state=optuna.trial.TrialState.COMPLETE)
    again = trial_limit(SMOL, config, Workload(), profile, [ran], repeats=3, repeat_time_s=60)  # type: ignore[list-item]
    assert again.seconds == pytest.approx(3 * first.seconds, rel=1e-3)
    assert "x 3.00: this study's 1 trials" in again.reason
    assert again.expected_s == pytest.approx(3 * first.predicted_s, rel=1e-3)
    # A compile prior is not scaled by what eager trials taught: a fast machine's O0 trials do not make a compile
    # look short.
    quick = types.SimpleNamespace(user_attrs={"trial_seconds": 0.1 * first.predicted_s,
                                              "trial_limit": first.to_dict()}, state=optuna.trial.TrialState.COMPLETE)
    fused = DeployConfig(quant="none", dtype="bf16", batch_size=8, fusion_level="O2", layers_per_subgraph=4)
    o2 = trial_limit(SMOL, fused, Workload(), profile, [quick], repeats=3, repeat_time_s=60)  # type: ignore[list-item]
    assert o2.expected_s >= o2.parts["compile_s"] == 480.0


def test_timed_runs_stop_on_spread_time_or_count():
    logs: list[str] = []
    steady = iter([100.0, 102.0, 50.0])
    runs, why = timed_runs(lambda: {"throughput_tok_s": next(steady)}, RunPolicy(), logs.append)
    assert len(runs) == 2 and why.startswith("spread known")
    noisy = iter([100.0, 70.0, 130.0])
    runs, why = timed_runs(lambda: {"throughput_tok_s": next(noisy)}, RunPolicy(), logs.append)
    assert len(runs) == 3 and why.startswith("count")

    def slow_run() -> dict:
        time.sleep(0.3)
        return {"throughput_tok_s": float(len(logs))}
    runs, why = timed_runs(slow_run, RunPolicy(time_cap_s=0.5, spread_tol=0.0), logs.append)
    assert len(runs) == 1 and why.startswith("time cap")
    runs, why = timed_runs(slow_run, RunPolicy(time_cap_s=0.5, spread_tol=0.0, min_repeats=2), logs.append)
    assert len(runs) == 2  # a baseline's two runs, whatever the cap


@pytest.mark.slow
def test_the_budget_counts_the_trials_not_the_set_up(tmp_path, monkeypatch):
    """`autotune search --timeout` on the simulator, with a set-up that takes longer than the whole budget: trials
    still run, for about the budget, from the first trial on."""
    import autotune.api.run as search_api
    from autotune.cli.main import main

    real_prepare = search_api.prepare_study

    def slow_prepare(*args, **kwargs):
        time.sleep(4.0)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(search_api, "prepare_study", slow_prepare)
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"*": "sleep:0.25"}))
    url = f"sqlite:///{tmp_path}/b.db"
    code = main(["search", "--model", "llama-7b", "--backend", "sim-faults", "--hardware", "a100-80g",
                 "--trials", "200", "--timeout", "0.05", "--study", "b", "--storage", url, "--out",
                 str(tmp_path / "r"), "--no-guide"])
    assert code == 0
    trials = optuna.load_study(study_name="b", storage=url).trials
    done = [t for t in trials if t.state.is_finished()]
    assert 4 <= len(done) <= 16, len(done)  # 3 s of 0.25 s trials
    saved = optuna.load_study(study_name="b", storage=url).user_attrs["worker_settings"]
    assert saved["deadline"] > done[0].datetime_start.timestamp()
    assert max(t.datetime_complete.timestamp() for t in done) <= saved["deadline"] + GRACE_S  # none past it


def test_workers_keep_to_the_studys_deadline(tmp_path, monkeypatch):
    """A worker restores the study's deadline from its storage and keeps to it: its trials hang until their limits
    kill them, and none ends past the deadline plus the grace."""
    from test_search_budget import HangingBackend
    from test_study import _study

    import autotune.study.trial_limit as limits
    from autotune.space.search_space import DEFAULT_SPACE, load_space
    from autotune.study.loop import run_search

    monkeypatch.setattr(limits, "GRACE_S", 0.5)
    deadline = time.time() + 2.0
    settings = SearchSettings(model="m", study="s", storage=f"sqlite:///{tmp_path}/s.db", trials=None,
                              timeout_s=2.0, deadline=deadline)
    study = _study(tmp_path)
    study.set_user_attr("worker_settings", settings_attr(settings, "scripted", None, str(DEFAULT_SPACE), False))
    study.set_user_attr("target_trials", None)
    restored, _ = _settings(study, settings.storage, None)
    assert restored.deadline == deadline and restored.timeout_s == 2.0 and restored.trials is None
    backend = HangingBackend()
    run_search(restored, load_space(DEFAULT_SPACE), backend, study, target=None)
    ended = [t.datetime_complete.timestamp() for t in study.trials if t.datetime_complete]
    assert backend.jobs and max(ended) <= deadline + 0.5 + 0.5
@pytest.mark.slow
def test_a_trial_stopped_at_its_limit_kills_its_process_group_and_keeps_its_gate(tmp_path):
    """The child starts a grandchild in its own group (as inductor's compile workers are), checkpoints its gate
    figures, then hangs; at the limit both go, and the result keeps the figures."""
    entry = tmp_path / "hang_entry"
    entry.mkdir()
    pidfile = tmp_path / "grandchild.pid"
    (entry / "__init__.py").write_text("")
    (entry / "__main__.py").write_text(f"""
import json, subprocess, sys, time
from pathlib import Path
from autotune.trial.child import partial_path
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path({str(pidfile)!r}).write_text(str(g.pid))
partial_path(Path(sys.argv[2])).write_text(json.dumps({{"gate": {{"tie_aware_agreement": 0.999, "passed": True}}}}))
print("[ 0.0s] gated; benchmarking forever", flush=True)
time.sleep(120)
""")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    job = Job(kind=JobKind.TRIAL, model="m", workload=Workload().to_dict())
    started = time.perf_counter()
    result = run_isolated(job, 3.0, entry="hang_entry", env=env)
    assert time.perf_counter() - started < 30
    assert "timed out after 3 s" in (result.reason or "")
    assert result.gate == {"tie_aware_agreement": 0.999, "passed": True}
    grandchild = int(pidfile.read_text())
    deadline = time.time() + 5
    while time.time() < deadline and Path(f"/proc/{grandchild}").exists():
        state = Path(f"/proc/{grandchild}/stat").read_text().split()[2] if Path(f"/proc/{grandchild}").exists() else "X"
        if state == "Z":
            break  # killed, waiting for its (dead) parent's reaper
        time.sleep(0.1)
    alive = Path(f"/proc/{grandchild}").exists() and Path(f"/proc/{grandchild}/stat").read_text().split()[2] != "Z"
    assert not alive, "the trial's grandchild outlived its limit"


def test_the_probe_and_the_trials_see_the_same_isa_caps():
    """The child's environment is the parent's: ONEDNN_MAX_CPU_ISA set for the search reaches every trial."""
    out = subprocess.run([sys.executable, "-c", "from autotune.host import isa_level; print(isa_level())"],
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("avx2", "sse")


def test_a_pick_past_the_budget_is_recorded_not_run_and_a_queued_one_waits_for_the_next_run():
    from autotune.study.coordination import tally
    from autotune.study.turns import over_budget as _over_budget

    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    config = DeployConfig(quant="none", dtype="fp32")
    sampled = study.ask()
    assert not _over_budget(study, sampled, config, 100.0, 200.0)  # it fits: nothing happens
    assert _over_budget(study, sampled, config, 300.0, 200.0)
    frozen = study.trials[0]
    assert frozen.state == optuna.trial.TrialState.FAIL and "300 s" in frozen.user_attrs["reason"]
    assert tally(study.trials)[0] == 0  # not counted against --trials
    study.enqueue_trial({"x": 1})
    queued = study.ask()
    assert _over_budget(study, queued, config, 300.0, 200.0)
    assert study.get_trials(states=(optuna.trial.TrialState.WAITING,))  # queued again for the next run


def test_o2s_packaged_compile_reaches_the_trials_timing_and_the_cost_model():
    """O2 is torch.export and AOTInductor packages, which dynamo's timers never see: the packages' own seconds are
    the trial's compile_s, and the study's compile estimate for O2 learns from them."""
    from autotune.study.compile_cost import compile_estimate
    from autotune.trial.run import _EngineStages

    stages = object.__new__(_EngineStages)
    stages.engine = types.SimpleNamespace(packaged=types.SimpleNamespace(compile_seconds=120.0))
    assert stages.timing()["compile_s"] >= 120.0
    stages.engine = types.SimpleNamespace(packaged=None)
    assert stages.timing()["compile_s"] < 120.0
    config = DeployConfig(fusion_level="O2", layers_per_subgraph=0, batch_size=16)
    trial = optuna.trial.create_trial(values=[1.0, 1.0, 1.0], user_attrs={
        "config": config.to_dict(), "timing": {"compile_s": 120.0}})
    estimate = compile_estimate(config, 30, [trial], probe_compile_s=10.0, load_s=30.0)
    assert estimate.seconds == pytest.approx(120.0) and "of this study's 1 O2 trials" in estimate.how
