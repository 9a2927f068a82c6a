"""A trial's compute-limit figures (sim/limit.py) from what its study stored: the model, the workload, the probe's
matmul rates, the trial's configuration, throughput and threads. Read by the results table and the recipe."""
from __future__ import annotations

from collections.abc import Mapping

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.models.registry import resolve_model
from autotune.sim.limit import compute_limit

__all__ = ["trial_compute_limit"]


def trial_compute_limit(attrs: Mapping, trial_attrs: Mapping) -> dict | None:
    """None where the study has no measured rates (simulated, another device, a study from before the probe
    measured them) or the trial has no benchmark."""
    rates = ((attrs.get("capabilities") or {}).get("figures") or {}).get("rate_gflops")
    bench, config = trial_attrs.get("bench"), trial_attrs.get("config")
    if not rates or not bench or not config or attrs.get("measured") is False:
        return None
    try:
        spec = resolve_model(attrs["model"])
        deploy = DeployConfig.from_dict(config)
    except (AutotuneError, KeyError, TypeError, ValueError):
        return None
    return compute_limit(spec, deploy, Workload(**attrs["workload"]), bench["throughput_tok_s"], rates,
                         trial_attrs.get("threads") or deploy.device_power)
