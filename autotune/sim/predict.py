"""The analytical model: roofline time of each step plus launch overheads, scheduled like this project's engine
(offline requests admitted `batch_size` at a time, prefilled together, decoded together)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import ModelSpec
from autotune.sim.cost import HEAD_KERNELS, StepCost, step_cost
from autotune.sim.hardware import HardwareProfile
from autotune.sim.memory_estimate import estimate_memory

__all__ = ["Prediction", "predict", "step_seconds"]

NOTE_SPREAD = "the model has no run-to-run variance: p99 equals p50 within a wave, throughput min = max"


@dataclass(frozen=True, slots=True)
class Prediction:
    feasible: bool
    reason: str
    throughput_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    peak_memory_mb: float
    kv_reserved_mb: float
    kv_pages: int
    energy_per_token_j: float | None
    decode_bound: str  # "memory", "compute" or "overhead": what dominates a decode step
    breakdown: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def bench(self) -> dict:
        """The figures under the keys of a measured trial's `bench`."""
        return {
            "throughput_tok_s": self.throughput_tok_s, "throughput_min": self.throughput_tok_s,
            "throughput_max": self.throughput_tok_s, "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p99_ms": self.ttft_p99_ms, "tpot_p50_ms": self.tpot_p50_ms, "tpot_p99_ms": self.tpot_p99_ms,
            "peak_memory_mb": self.peak_memory_mb, "kv_reserved_peak_mb": self.kv_reserved_mb,
            "kv_pages_peak": self.kv_pages, "repeats": 0, "warmup_s": 0.0,
            "energy_per_token_j": self.energy_per_token_j,
        }

    def to_dict(self) -> dict:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out


def _subgraphs(spec: ModelSpec, config: DeployConfig) -> int:
    if config.fusion_level == "O0":
        return 0
    lps = config.layers_per_subgraph or spec.num_layers
    return math.ceil(spec.num_layers / lps)


def step_seconds(cost: StepCost, spec: ModelSpec, config: DeployConfig, profile: HardwareProfile,
                 rows: int) -> tuple[float, dict[str, float]]:
    """max(compute, memory) + overheads, and the parts (seconds)."""
    f = profile.factors
    level = profile.level(config.device_power)
    clock, bw_frac = level["clock"], level.get("bandwidth", 1.0)
    # w8a8 runs its matmuls on the int8 units; weight-only schemes dequantize and multiply in the dtype. Where the
    # profile measured its kernels (cpu-local: the capability probe), a scheme runs at its kernel's measured
    # fraction of the dtype's rate.
    dtype_peak = profile.matmul_tflops(config.dtype) * 1e12
    mm_peak = profile.int8_tops * 1e12 if config.quant == "w8a8" else dtype_peak
    slowdown = profile.kernel_slowdown.get(f"{config.quant}@{config.dtype}")
    if slowdown:
        mm_peak = dtype_peak / slowdown
    compute = (cost.matmul_flops / mm_peak + cost.attention_flops / dtype_peak) / (f.compute_eff * clock)
    weights = cost.weight_bytes / f.quant_bw_eff.get(config.quant, 1.0)
    memory = (weights + cost.activation_bytes + cost.kv_bytes) / (profile.bandwidth_gbs * 1e9 * f.bandwidth_eff
                                                                  * bw_frac)
    kernels = spec.num_layers * cost.kernels_per_layer
    if config.fusion_level == "O0":
        launch = (kernels + HEAD_KERNELS) * f.eager_launch_us
    else:
        # Each subgraph is one launch; its kernels still cost their fixed device time. The head stays eager.
        launch = _subgraphs(spec, config) * f.graph_launch_us + kernels * f.kernel_us + HEAD_KERNELS * f.eager_launch_us
    overhead = (launch + rows * f.seq_step_us) * 1e-6
    return max(compute, memory) + overhead, {"compute": compute, "memory": memory, "overhead": overhead}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def predict(spec: ModelSpec, config: DeployConfig, workload: Workload, profile: HardwareProfile) -> Prediction:
    """Predicted figures of `config` serving `workload` on `profile`; infeasible (with the reason) when it does
    not fit the device's memory or the model's context."""
    notes = [NOTE_SPREAD]
    mem = estimate_memory(spec, config, workload, profile)
    fused = config.fusion_level == "O2"
    prompt = (workload.prompt_min + workload.prompt_max) / 2
    out = workload.output_tokens
    # Compiled graphs pad every step to batch_size rows (static shapes); eager runs the rows it has.
    padded = config.fusion_level != "O0"
    waves: list[int] = [config.batch_size] * (workload.num_requests // config.batch_size)
    if workload.num_requests % config.batch_size:
        waves.append(workload.num_requests % config.batch_size)
    clock = profile.level(config.device_power)["clock"]
    ttft: list[float] = []
    tpot: list[float] = []
    clock_s = 0.0
    parts: dict[str, float] = {}
    cache: dict[int, tuple[float, float, dict[str, float]]] = {}
    for live in waves:
        rows = config.batch_size if padded else live
        if rows not in cache:
            prefill = step_cost(spec, config.quant, fused, rows, round(prompt), 0.0, config.page_size, config.dtype)
            # Decode at the mean context of the wave's steps: cost is linear in context, so the mean is exact
            # apart from page rounding.
            decode = step_cost(spec, config.quant, fused, rows, 1, prompt + out / 2, config.page_size,
                               config.dtype)
            t_pf, _ = step_seconds(prefill, spec, config, profile, rows)
            t_dec, parts = step_seconds(decode, spec, config, profile, rows)
            cache[rows] = (t_pf, t_dec, parts)
        t_pf, t_dec, parts = cache[rows]
        ttft += [clock_s + t_pf] * live
        tpot += [t_dec] * live
        clock_s += t_pf + (out - 1) * t_dec
    tokens = workload.num_requests * out
    capacity = profile.memory_gb * 2**30
    reasons = []
    if mem.total > capacity:
        p = mem.parts_mb()
        reasons.append(f"needs {mem.total / 2**30:.1f} GiB but {profile.name} has {profile.memory_gb:g} GiB "
                       f"(weights {p['weights'] / 1024:.1f}, KV pages {p['kv_reserved'] / 1024:.1f}, activations "
                       f"{p['activations'] / 1024:.1f}, workspace {p['workspace'] / 1024:.1f} GiB)")
    if workload.max_seq_len > spec.max_position:
        reasons.append(f"requests of {workload.max_seq_len} tokens exceed the model's context of {spec.max_position}")
    energy = None
    if profile.power_w is not None:
        # Dynamic power ~ f * V^2 with voltage following the clock: ~f^3; the static part stays.
        f = profile.factors.static_power_fraction
        energy = profile.power_w * (f + (1 - f) * clock**3) * clock_s / tokens
    else:
        notes.append(f"{profile.name} states no board power: energy is not predicted")
    bound = max(parts, key=lambda k: parts[k])
    return Prediction(
        feasible=not reasons, reason="; ".join(reasons), throughput_tok_s=tokens / clock_s,
        ttft_p50_ms=_percentile(ttft, 0.5) * 1e3, ttft_p99_ms=_percentile(ttft, 0.99) * 1e3,
        tpot_p50_ms=_percentile(tpot, 0.5) * 1e3, tpot_p99_ms=_percentile(tpot, 0.99) * 1e3,
        peak_memory_mb=mem.total / 2**20, kv_reserved_mb=mem.kv_reserved / 2**20, kv_pages=mem.kv_pages,
        energy_per_token_j=energy, decode_bound=bound,
        breakdown={**{f"decode_{k}_ms": v * 1e3 for k, v in parts.items()},
                   **{f"{k}_mb": v for k, v in mem.parts_mb().items()}},
        notes=tuple(notes),
    )
