"""A trial of any runtime: build, gate, checkpoint, benchmark. A runtime supplies the stages (TrialStages: the
engine's in autotune/trial/run.py, llama.cpp's in autotune/llamacpp/trial.py); the order, the timing, the gate
cache's key and store, and the checkpoint that keeps the gate figures of a trial stopped at its limit are here,
once, for all of them."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from autotune.config.slo import Slo
from autotune.gate.cache import store_gate
from autotune.gate.result import verdict_word
from autotune.progress import log
from autotune.trial.gate_key import trial_gate_key
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["TrialStages", "run_trial", "gate_line", "Checkpoint"]

# Called with what a trial has found so far (its gate figures, before its benchmark): a trial stopped at its
# wall-clock limit keeps them (autotune/trial/child.checkpoint_writer writes them beside the result).
Checkpoint = Callable[[dict], None]


class TrialStages(Protocol):
    """One runtime's trial of one job.
    - `device`, `versions`, `checksum`: what its gate figures are keyed under (the backend's name; the numerics
      software, None for torch's stack; the model's checksum, known once `build()` has returned).
    - `build()`: a result with `build_s` (and what else the runtime records), or a not-OK result (an infeasible
      configuration) that ends the trial.
    - `gate(cached)`: the gate figures (GateResult.to_dict); `cached` is the job's teacher-forced figures of these
      numerics where the study had them, and then only the decode check runs.
    - `bench()`: the benchmark's figures.
    - `goodput(slo, bench, budget_s)`: with an SLO, the goodput rate search on the serving path (benchmark/goodput.
      measure_goodput), started from the benchmark's throughput, in about `budget_s`; its warm-up (the serving
      graphs) is not counted in the budget. A runtime without a step runner leaves it out.
    - `holdout()`: the decode check's figures on the held-back prompts (a HOLDOUT job: no gate, no benchmark).
    - `timing()`: seconds to add to the trial's timing when it ends (the compiler's share).
    - `close()`: free what the build holds; called however the trial ends."""

    device: str
    versions: dict | None
    checksum: str

    def build(self) -> JobResult: ...

    def gate(self, cached: dict | None) -> dict: ...

    def bench(self) -> dict: ...

    def holdout(self) -> dict: ...

    def timing(self) -> dict: ...

    def close(self) -> None: ...


def gate_line(gate: dict) -> str:
    line = f"tie-aware {gate['tie_aware_agreement']:.4f}, raw {gate['raw_agreement']:.4f}, ppl {gate['perplexity']:.2f}"
    if gate.get("stopped_early"):
        return f"{line} after {gate['positions']} positions: stopped, a pass was out of reach (FAIL)"
    if gate.get("decode_agreement") is not None:
        line += (f"; decode {gate['decode_agreement']:.4f} over {gate['decode_positions']} positions of "
                 f"{gate['decode_prompts']} prompts, {gate['decode_verdict']}")
    return f"{line} ({verdict_word(gate)})"


# The goodput search takes at most a quarter of its trial: a third of what the trial took before it.
GOODPUT_SHARE = 1 / 3


def _goodput(job: Job, stages: TrialStages, result: JobResult, timing: dict) -> None:
    """The goodput under the job's SLO, on the bench figures (`goodput_req_s`, `goodput_tok_s`) and whole in
    `result.goodput`; a runtime that cannot measure it says so."""
    measure = getattr(stages, "goodput", None)
    if measure is None:
        result.goodput = {"met": False, "goodput_req_s": 0.0, "goodput_tok_s": 0.0,
                          "note": "this runtime has no step runner to drive open-loop: goodput not measured"}
    else:
        spent = sum(v for k, v in timing.items() if k in ("build_s", "gate_s", "bench_s"))
        t0 = time.perf_counter()
        result.goodput = measure(Slo(**job.slo), result.bench, GOODPUT_SHARE * spent)
        timing["goodput_s"] = time.perf_counter() - t0
    result.bench["goodput_req_s"] = result.goodput["goodput_req_s"]
    result.bench["goodput_tok_s"] = result.goodput["goodput_tok_s"]
    log(f"  goodput: {result.goodput['goodput_req_s']:.3g} req/s ({result.goodput['goodput_tok_s']:.1f} tok/s)"
        + (f"; {result.goodput['note']}" if result.goodput.get("note") else ""))


def run_trial(job: Job, stages: TrialStages, checkpoint: Checkpoint) -> JobResult:
    """Run `job` through `stages`, handing `checkpoint` the gate figures before the benchmark."""
    try:
        result = stages.build()
        if not result.ok:
            return result
        timing = result.timing = {**(result.timing or {}), "build_s": result.build_s}
        t0 = time.perf_counter()
        if job.kind is JobKind.HOLDOUT:
            log("  held-back check: the decode check on prompts no trial saw")
            result.holdout = stages.holdout()
            timing["holdout_s"] = result.holdout["seconds"] = time.perf_counter() - t0
            log(f"  held-back: decode {result.holdout['decode_agreement']:.4f} over "
                f"{result.holdout['decode_positions']} positions, {result.holdout['decode_verdict']}")
            timing.update(stages.timing())
            return result
        gate = stages.gate(job.gate)
        timing["gate_s"] = gate["seconds"] = time.perf_counter() - t0
        cached = job.gate is not None
        if not cached:
            # The study looks this configuration's verdict up under the same key (autotune/study/loop.py).
            store_gate(trial_gate_key(job, checksum=stages.checksum, device=stages.device, versions=stages.versions),
                       gate)
        result.gate, result.gate_cached = gate, cached
        checkpoint({"gate": gate, "gate_cached": cached, "timing": timing, "build_s": result.build_s})
        log(f"  gate: {gate_line(gate)}")
        if gate.get("marginal") and job.accept_marginal:
            gate["passed"] = gate["accepted_marginal"] = True  # the study's front and the recipe read it so
            log("  gate: marginal, accepted (--accept-marginal)")
        if not gate["passed"]:
            result.status = Status.GATED
        else:
            log("  benchmark")
            t0 = time.perf_counter()
            result.bench = stages.bench()
            timing["bench_s"] = time.perf_counter() - t0
            if job.slo is not None:
                _goodput(job, stages, result, timing)
        timing.update(stages.timing())
        return result
    finally:
        stages.close()
