"""How close a measured configuration runs to this machine's limit: the compute rate its decode achieved (the
model's FLOPs per output token x output tokens/s) as a fraction of the capability probe's measured rate for a
decode-shaped matmul in its precision at its batch size, times its threads. On a 2-core CPU that product is the
physical ceiling a user can read; a fraction far below it says where the time goes is not arithmetic.

The FLOPs are a decode step's (sim/cost.py step_cost: every linear layer and the head, attention over the mean
context), counted once per output token; prefill's work, done once per request, is not in the numerator, so a
prefill-heavy workload reads lower than its real arithmetic. The ceiling is the plain matmul's rate in the
configuration's dtype: a weight-only scheme computes in it; an int8 scheme may have a faster unit, which this
does not credit."""
from __future__ import annotations

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import ModelSpec
from autotune.sim.cost import step_cost

__all__ = ["flops_per_output_token", "compute_limit"]


def flops_per_output_token(spec: ModelSpec, config: DeployConfig, workload: Workload) -> float:
    context = (workload.prompt_min + workload.prompt_max) / 2 + workload.output_tokens / 2
    knobs = config.knobs.cost_knobs()
    if knobs is None:
        raise ValueError(f"{config.label()}: no cost model of its arithmetic")
    step = step_cost(spec, knobs["quant"], False, 1, 1, context, knobs["page_size"], knobs["dtype"])
    return step.matmul_flops + step.attention_flops


def _rate_at(rates: dict[str, float], batch: int) -> tuple[int, float] | None:
    """The rate measured at the largest probed row count not above `batch` (the smallest where all are above)."""
    probed = sorted((int(rows), gflops) for rows, gflops in rates.items())
    if not probed:
        return None
    below = [p for p in probed if p[0] <= batch]
    return below[-1] if below else probed[0]


def compute_limit(spec: ModelSpec, config: DeployConfig, workload: Workload, throughput_tok_s: float,
                  rate_gflops: dict[str, dict[str, float]] | None, threads: int | None) -> dict | None:
    """{"achieved_gflops", "ceiling_gflops", "fraction", "how"}; None where the probe measured no rate for this
    precision (a study from before it, another device) or where the runtime's arithmetic has no probed rate (a
    quantized GGUF)."""
    knobs = config.knobs.cost_knobs()
    rates = (rate_gflops or {}).get(knobs["dtype"]) if knobs else None
    at = _rate_at(rates, config.batch_size) if rates else None
    if at is None or not threads:
        return None
    rows, per_thread = at
    achieved = flops_per_output_token(spec, config, workload) * throughput_tok_s / 1e9
    ceiling = per_thread * threads
    return {"achieved_gflops": round(achieved, 2), "ceiling_gflops": round(ceiling, 2),
            "fraction": round(achieved / ceiling, 3),
            "how": f"decode FLOPs per output token x tok/s against the probe's {knobs['dtype']} matmul at {rows} rows "
                   f"({per_thread:.1f} GFLOP/s a thread) x {threads} threads"}
