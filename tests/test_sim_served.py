"""The simulator's goodput (sim/served.py): a discrete-event run of the serving scheduler on a virtual clock, read by
the same open-loop driver and rate search as a measured trial; the guide ordering an SLO study's trials by it; the
sim backend's recipes carrying it, labelled simulated."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.benchmark.goodput import goodput_workload
from autotune.config.deploy import DeployConfig
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.engine.sequence import Request
from autotune.models.registry import resolve_model
from autotune.sim.cost import step_cost
from autotune.sim.hardware import load_profile
from autotune.sim.predict import step_seconds
from autotune.sim.served import SimulatedRunner, VirtualClock, predict_goodput

SPEC = resolve_model("smollm2-135m")
CPU = load_profile("cpu-local")


def _decode_s(config: DeployConfig, rows: int, context: int) -> float:
    cost = step_cost(SPEC, config.quant, config.fusion_level == "O2", rows, 1, float(context), config.page_size,
                     config.dtype)
    return step_seconds(cost, SPEC, config, CPU, rows)[0]


def test_the_simulated_runner_schedules_like_the_server_and_time_moves_only_by_its_forwards():
    clock = VirtualClock()
    config = DeployConfig(batch_size=2, prefill_chunk=0)
    runner = SimulatedRunner(SPEC, config, CPU, max_seq_len=256, clock=clock)
    done = [runner.submit(Request([1] * 100, 4, min_new_tokens=4), arrival=0.0) for _ in range(3)]
    assert (runner.num_waiting, runner.num_running) == (3, 0) and clock.now == 0.0
    runner.step()  # two admitted (the batch), prefilled together, then their first decode
    assert (runner.num_waiting, runner.num_running) == (1, 2)
    assert [len(c.output_ids) for c in done] == [2, 2, 0]
    first = clock.now
    while runner.num_waiting or runner.num_running:
        runner.step()
    assert [len(c.output_ids) for c in done] == [4, 4, 4] and all(c.finish_reason == "length" for c in done)
    # The third waited for a row: its first token comes after the first two ended.
    assert done[2].ttft > done[0].token_times[-1] - done[0].arrival
    assert all(b > a for c in done for a, b in zip(c.token_times, c.token_times[1:]))
    # A decode step of the first two rows took the model's time for two rows at their context, in whole pages.
    gap = done[0].token_times[2] - done[0].token_times[1]
    assert gap == pytest.approx(_decode_s(config, 2, 128)) and first > gap
    assert runner.kv_usage()[0] == 0  # every page given back


def test_a_prediction_is_deterministic_and_tighter_objectives_serve_fewer_requests():
    config = DeployConfig(batch_size=8)
    w = Workload()
    # Limits in the profile's own step times (its peaks are this machine's, measured on first use).
    step_ms = _decode_s(config, 8, 256) * 1e3
    loose = Slo(ttft_ms=60 * step_ms, tpot_ms=4 * step_ms)
    first = predict_goodput(SPEC, config, w, CPU, loose)
    assert first == predict_goodput(SPEC, config, w, CPU, loose)
    assert first["simulated"] is True and first["met"] and first["goodput_req_s"] > 0
    assert first["goodput_tok_s"] == pytest.approx(first["goodput_req_s"] * goodput_workload(w, 1.0)
                                                   .mean_output_tokens)
    rates = [r["rate"] for r in first["rates"] if r["attained"]]
    assert max(rates) == first["goodput_req_s"]
    tighter = predict_goodput(SPEC, config, w, CPU, replace(loose, ttft_ms=15 * step_ms))
    assert 0 < tighter["goodput_req_s"] < first["goodput_req_s"]
    # No rate meets a TPOT below what one row's decode step takes: recorded as unmet, with the best attainment.
    out_of_reach = replace(loose, tpot_ms=_decode_s(config, 1, 128) * 1e3 / 2)
    none = predict_goodput(SPEC, config, w, CPU, out_of_reach)
    assert not none["met"] and none["goodput_req_s"] == 0 and "no rate tried met the SLO" in none["note"]


def test_a_prompt_arriving_while_others_decode_is_prefilled_a_chunk_a_step():
    """As the serving runner schedules it: with a 64-token chunk, a 150-token prompt that arrives while another
    sequence decodes takes three forwards (64, 64, 22) before its first token, each step also decoding the other;
    with whole prompts, one."""
    steps = {}
    for chunk in (64, 0):
        runner = SimulatedRunner(SPEC, DeployConfig(batch_size=4, prefill_chunk=chunk), CPU, max_seq_len=256,
                                 clock=VirtualClock())
        running = runner.submit(Request([1] * 16, 20, min_new_tokens=20))
        runner.step()
        late = runner.submit(Request([1] * 150, 4, min_new_tokens=4))
        n = 0
        while not late.output_ids:
            runner.step()
            n += 1
        steps[chunk] = (n, len(running.output_ids))
    assert steps == {64: (3, 5), 0: (1, 3)}


def test_the_guide_under_an_slo_picks_the_best_predicted_goodput_over_the_prefill_chunks():
    from autotune.space.search_space import DEFAULT_SPACE, load_space
    from autotune.space.serving_knobs import offline_space
    from autotune.study.guide import Guide

    # Limits in the profile's own step times (its peaks are this machine's): a batch of 16 decodes within them.
    step_ms = _decode_s(DeployConfig(dtype="fp32", batch_size=16), 16, 256) * 1e3
    slo = Slo(ttft_ms=25 * step_ms, tpot_ms=3 * step_ms)
    space = load_space(DEFAULT_SPACE).restrict("dtype", ("fp32",), "the profile's rate").restrict(
        "quant", ("none",), "one scheme").restrict("device_power", (1, 2), "the profile's levels")
    assert "prefill_chunk" in {d.name for d in space.dimensions}
    assert "prefill_chunk" not in {d.name for d in offline_space(space).dimensions}
    guide = Guide(SPEC, space, Workload(), CPU, slo)
    study = optuna.create_study(directions=["maximize", "minimize"])
    params, predicted = guide.next_params(study, turn=0, explore=True)
    assert set(predicted) == {"throughput_tok_s", "tpot_p99_ms", "peak_memory_mb", "goodput_req_s"}
    config = space.to_config(params)
    picked = predict_goodput(SPEC, config, Workload(), CPU, slo)["goodput_req_s"]
    assert predicted["goodput_req_s"] == pytest.approx(picked, abs=0.01) and picked > 0
    # No other prefill chunk of the same deployment is predicted to serve more.
    for chunk in space.dimension("prefill_chunk").values:
        other = replace(config, knobs=replace(config.knobs, prefill_chunk=chunk))
        assert predict_goodput(SPEC, other, Workload(), CPU, slo)["goodput_req_s"] <= picked + 1e-9
    # Offline, the same guide predicts no goodput.
    plain = Guide(SPEC, offline_space(space), Workload(), CPU).next_params(study, turn=0, explore=True)
    assert "goodput_req_s" not in plain[1]


def test_a_simulated_slo_search_writes_recipes_whose_goodput_is_labelled_simulated(tmp_path: Path, monkeypatch):
    import autotune
    from autotune.recipes.recipe import load_recipe

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    result = autotune.search("llama-7b", backend="sim", hardware="h100", seed=0, minutes=0, trials=4,
                             storage=f"sqlite:///{tmp_path}/s.db", out=tmp_path / "recipes",
                             slo="ttft=1s,tpot=50ms")
    study = optuna.load_study(study_name=result.study, storage=result.storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(t.user_attrs["goodput"]["simulated"] for t in done)
    assert any(t.user_attrs["goodput"]["goodput_req_s"] > 0 for t in done)
    recipes = [load_recipe(p) for p in result.recipes if p.suffix == ".yaml"]
    assert recipes and all(r.simulated and r.data["goodput"]["simulated"] for r in recipes)
    text = Path(next(p for p in result.recipes if p.suffix == ".yaml")).read_text()
    assert yaml.safe_load(text)["goodput"]["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 50.0, "attainment": 0.9}
