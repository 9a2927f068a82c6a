"""A search tries once of each compiled fusion level and each weight-only quantization as soon as it can afford it:
compiled levels once two eager points are measured, cheapest first, then the weight-only schemes (at O0: their
accuracy is learnt eagerly first; the baseline's eager point is enough for them), never one the probe ordered last
as too slow here, never a value tried already."""
from __future__ import annotations

import optuna
import pytest

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.sim.hardware import load_profile
from autotune.space.search_space import load_space
from autotune.study.guide import Guide
from autotune.study.turns import FIRST_ROLE, enqueue_first_builds

_BENCH = {"throughput_tok_s": 100.0, "tpot_p99_ms": 50.0, "ttft_p50_ms": 500.0, "peak_memory_mb": 500.0}
_GATE = {"tie_aware_agreement": 0.999, "passed": True}


def _study(configs: list[DeployConfig]) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    for config in configs:
        study.add_trial(optuna.trial.create_trial(
            params={}, distributions={}, values=[100.0, 50.0, 500.0],
            user_attrs={"config": config.to_dict(), "bench": _BENCH, "gate": _GATE}))
    return study


def _guide() -> Guide:
    # A fixed profile (not this machine's probe): the rule, not the predictions, is under test.
    space = load_space().restrict("dtype", ("bf16",), "this test's CPU computes bf16")
    return Guide(resolve_model("smollm2-135m"), space, Workload(), load_profile("a100-80g"))


def _queued(study: optuna.Study) -> dict:
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["role"] == FIRST_ROLE
    return waiting[0].system_attrs["fixed_params"]


@pytest.mark.slow  # the guide predicts the default space's grid at each pick: seconds each
def test_compiled_levels_first_then_weight_only_schemes_then_nothing():
    guide = _guide()
    eager = [DeployConfig(dtype="bf16", batch_size=b) for b in (8, 16)]
    seconds = {"O0": 50.0, "O1": 100.0, "O2": 200.0}

    def cost(c: DeployConfig) -> float:
        return seconds[c.fusion_level]

    one = _study(eager[:1])  # one eager point: no compiled build yet, a weight-only one already
    assert enqueue_first_builds(one, guide, cost, 1000.0) and _queued(one)["fusion_level"] == "O0"
    assert _queued(one)["quant"] in ("w8a16", "w4a16")
    study = _study(eager)
    assert enqueue_first_builds(study, guide, cost, 1000.0) and _queued(study)["fusion_level"] == "O1"  # cheapest
    assert not enqueue_first_builds(study, guide, cost, 1000.0)  # a trial waits: nothing more is queued
    o1 = DeployConfig(dtype="bf16", batch_size=16, fusion_level="O1", layers_per_subgraph=0)
    study = _study([*eager, o1])
    assert enqueue_first_builds(study, guide, cost, 1000.0) and _queued(study)["fusion_level"] == "O2"
    o2 = DeployConfig(dtype="bf16", batch_size=16, fusion_level="O2", layers_per_subgraph=0)
    study = _study([*eager, o1, o2])
    assert enqueue_first_builds(study, guide, cost, 1000.0)
    first_quant = _queued(study)
    assert first_quant["quant"] in ("w8a16", "w4a16") and first_quant["fusion_level"] == "O0"
    tried = DeployConfig(dtype="bf16", batch_size=16, quant=first_quant["quant"])
    study = _study([*eager, o1, o2, tried])
    assert enqueue_first_builds(study, guide, cost, 1000.0)
    assert {_queued(study)["quant"], first_quant["quant"]} == {"w8a16", "w4a16"}


@pytest.mark.slow
def test_nothing_the_budget_cannot_hold_or_the_probe_ordered_last():
    guide = _guide()
    eager = [DeployConfig(dtype="bf16", batch_size=b) for b in (8, 16)]
    compiled = [DeployConfig(dtype="bf16", batch_size=16, fusion_level=level, layers_per_subgraph=0)
                for level in ("O1", "O2")]
    assert not enqueue_first_builds(_study(eager), guide, lambda c: 100.0, 100.0)  # beyond 90% of what is left
    guide.space = guide.space.note_ordered_last({"w8a16@bf16": "slow here", "w4a16@bf16": "slow here"})
    assert not enqueue_first_builds(_study([*eager, *compiled]), guide, lambda c: 10.0, 1000.0)
