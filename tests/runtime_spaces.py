"""A search space over two runtimes (the engine's and OpenVINO's, a few values each) and trials written into a study
by hand: what the tests of the guide's turns across runtimes start from (test_guide_runtimes.py,
test_peer_turns.py)."""
from __future__ import annotations

from pathlib import Path

import optuna

from autotune.space.search_space import SearchSpace, combine, load_space

__all__ = ["two_runtime_space", "add_trial", "three_objective_study"]

_ENGINE = """
version: 1
dimensions:
  dtype: {values: [fp32]}
  quant: {values: [none]}
  fusion_level: {values: [O0]}
  batch_size: {values: [8, 16]}
  page_size: {values: [16]}
  kv_policy: {values: [on_demand]}
  device_power: {values: [2]}
"""
_OPENVINO = """
version: 1
runtime: openvino
dimensions:
  batch_size: {values: [16, 8]}
  device_power: {values: [2]}
  weight_format: {values: [fp16, int8]}
  inference_precision: {values: [PRECISION]}
  kv_precision:
    by: inference_precision
    values: {PRECISION: [u8, PRECISION]}
  max_num_batched_tokens: {values: [256, 2048]}
"""


def two_runtime_space(folder: Path, precision: str) -> SearchSpace:
    """The engine's space and OpenVINO's at one inference `precision` (its KV cache u8 or the same)."""
    (folder / "e.yaml").write_text(_ENGINE)
    (folder / "o.yaml").write_text(_OPENVINO.replace("PRECISION", precision))
    return combine([load_space(folder / "e.yaml"), load_space(folder / "o.yaml")])


def add_trial(study: optuna.Study, space: SearchSpace, params: dict, gate: dict, bench: dict | None) -> None:
    """A finished trial of `params`: pruned at the gate where `bench` is None, else complete with its figures (a
    figure it lacks counts 1.0 as an objective)."""
    named = space.trial_params(params)
    dims = {d.trial_name(params): d for d in space.dimensions if d.name in params}
    distributions = {name: optuna.distributions.CategoricalDistribution(list(dims[name].values_for(params)))
                     for name in named}
    attrs = {"config": space.to_config(params).to_dict(), "gate": gate}
    if bench is None:
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params=named,
                                                  distributions=distributions, user_attrs=attrs))
        return
    attrs["bench"] = bench
    values = [bench["throughput_tok_s"], bench.get("tpot_p99_ms", 1.0), bench.get("peak_memory_mb", 1.0)]
    study.add_trial(optuna.trial.create_trial(values=values, params=named, distributions=distributions,
                                              user_attrs=attrs))


def three_objective_study() -> optuna.Study:
    return optuna.create_study(directions=["maximize", "minimize", "minimize"])
