"""What a trial is asked to do (Job) and what it reports back (JobResult): plain values that cross a process
boundary as JSON. Where the job runs (device, memory limit, which backend) is not part of it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from autotune.gate.corpus import EVAL_POSITIONS

__all__ = ["Job", "JobKind", "JobResult", "Status"]


class JobKind(str, Enum):
    TRIAL = "trial"  # build, gate (unless the gate figures are given), benchmark
    HOLDOUT = "holdout"  # build, then the decode check on the held-back prompts alone (autotune/results/holdout.py)
    REFERENCE = "reference"  # the fp32 reference's logits over the evaluation text, cached on disk
    HF_BASELINE = "hf_baseline"  # a speed baseline: transformers' generate, eager, in `baseline_dtype`


class Status(str, Enum):
    OK = "ok"
    GATED = "gated"  # built, failed the accuracy gate, not benchmarked
    INFEASIBLE = "infeasible"  # cannot fit or run on the hardware (a prediction of the simulator)
    ERROR = "error"  # crashed, timed out, out of memory, or an expected failure of the build


@dataclass(slots=True)
class Job:
    kind: JobKind
    model: str
    workload: dict
    config: dict = field(default_factory=dict)
    threads: int = 0
    min_agreement: float = 0.995
    tie_epsilon: float = 0.05
    # A build the decode check leaves undecided at its cap (marginal) counts as a pass: `search --accept-marginal`.
    accept_marginal: bool = False
    eval_positions: int = EVAL_POSITIONS
    repeats: int = 3  # at most this many timed runs of the whole workload (benchmark/policy.py)
    repeat_time_s: float = 60.0  # no timed run starts that would take the timed runs past this
    gate: dict | None = None  # cached gate figures for these numerics: skip the gate
    # The decoder linear layers to keep in the compute dtype, as given (a recipe's, re-measured by verify) instead
    # of ranked by sensitivity here; None: ranked.
    keep: list[str] | None = None
    baseline_batch: int = 8
    baseline_dtype: str = "auto"  # a speed baseline's precision: "auto" (the model's own) or one of DTYPES
    # The study's Pareto front so far ({"number", "throughput_tok_s", "tpot_p99_ms", "peak_memory_mb"} each): a
    # trial clearly dominated by one of them stops its timed repeats early.
    front: list[dict] = field(default_factory=list)
    # Latency objectives (config/slo.Slo.to_dict): after the benchmark, the trial's goodput under them
    # (benchmark/goodput.py), where its runtime's stages can measure it.
    slo: dict | None = None

    def __post_init__(self) -> None:
        self.kind = JobKind(self.kind)

    def to_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind.value}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


@dataclass(slots=True)
class JobResult:
    """Every field but `status` is optional: a failure has a `reason` (and the end of its log), a benchmarked
    trial `bench` and `gate`, a prediction `source` = "simulated" with its `prediction`."""

    status: Status
    reason: str | None = None
    bench: dict | None = None
    gate: dict | None = None
    gate_cached: bool | None = None
    build_s: float | None = None
    versions: dict | None = None
    threads: int | None = None
    compile_cache: dict | None = None
    log_tail: list[str] | None = None
    source: str | None = None  # "simulated" where the figures are predictions
    profile: str | None = None  # the simulator's hardware profile
    prediction: dict | None = None
    timing: dict | None = None  # seconds by stage: build_s, gate_s, compile_s (inside the others), bench_s
    path: str | None = None  # a reference job: where its logits are cached
    batch_size: int | None = None  # the speed baseline: its batch, precision and what it ran
    dtype: str | None = None
    what: str | None = None
    quant: dict | None = None  # the quantize step: method, layers converted and kept, calibration, sensitivity
    build: dict | None = None  # how the engine runs: its compiled artifact, prepacking, spilling (Engine.build_record)
    holdout: dict | None = None  # a HOLDOUT job's decode check on the held-back prompts
    goodput: dict | None = None  # with an SLO: the rate search, every rate tried (benchmark/goodput.find_goodput)

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @classmethod
    def error(cls, reason: str, log_tail: list[str] | None = None) -> JobResult:
        return cls(Status.ERROR, reason=reason, log_tail=log_tail)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, `status` as its string: what is stored in a study's attributes."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
