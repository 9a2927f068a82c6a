"""One job in this process: a trial (build the configuration, pass the gate, benchmark), the reference, or the
speed baseline. The device it builds on is given by the caller (autotune/trial/child.py); None is the CPU path."""
from __future__ import annotations

import platform
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

import torch
import transformers

from autotune.benchmark.bench import benchmark_engine, benchmark_hf_generate
from autotune.benchmark.peak_rss import rss_bytes
from autotune.benchmark.policy import policy_for
from autotune.config.deploy import TORCH_DTYPE_NAMES, DeployConfig
from autotune.config.workload import Workload
from autotune.devices.base import Device
from autotune.engine import Engine, build_engine
from autotune.engine.calibrated import QuantPlan
from autotune.errors import AutotuneError
from autotune.gate.accuracy import GateResult, decode_check, evaluate_gate
from autotune.gate.cache import gate_inputs, gate_key, reference_path, store_gate
from autotune.gate.corpus import bench_prompts, decode_prompts, eval_set_digest, eval_windows
from autotune.gate.reference import cached_reference
from autotune.models.registry import ModelSpec, resolve_model
from autotune.models.weights import auto_dtype, load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.quant.plan import quant_plan
from autotune.trial.compiler_cache import compile_seconds, compiler_cache_counts
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["run_job", "Checkpoint"]

# Called with what a job has found so far (a trial's gate figures, before its benchmark): a trial stopped at its
# wall-clock limit keeps them (autotune/trial/__main__.py writes them beside the result).
Checkpoint = Callable[[dict], None]


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for package in ("torchao", "optuna"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:  # a missing optional package only leaves its version out
            pass
    return out


def _reference(job: Job, spec: ModelSpec, tokenizer, device: Device | None, base_rss: int,
               checkpoint: Checkpoint) -> JobResult:
    cached_reference(model_checksum(spec), tokenizer, job.eval_positions, lambda: load_hf_model(spec, "float32"))
    return JobResult(Status.OK, path=str(reference_path(model_checksum(spec), eval_set_digest(job.eval_positions))))


def _gate(job: Job, engine: Engine, spec: ModelSpec, tokenizer, device: Device | None,
          workload: Workload) -> tuple[dict, bool]:
    """(gate figures, whether the teacher-forced part came from the cache). The decode check runs in every
    trial: it is of this configuration's decode path (batch size, page size), which the numerics key that the
    cache is keyed by does not hold."""
    checksum = model_checksum(spec)
    ref = cached_reference(checksum, tokenizer, job.eval_positions, lambda: load_hf_model(spec, "float32"))
    prompts = decode_prompts(tokenizer, eval_positions=job.eval_positions)
    # The benchmark's runner shapes: the decode graphs compiled here are the ones the benchmark runs.
    shapes = dict(max_seq_len=workload.max_seq_len, pool_tokens=engine.config.batch_size * workload.max_seq_len)
    if job.gate is not None:
        log("  gate: teacher-forced figures of these numerics cached; decode check through this configuration")
        decode = decode_check(engine, ref, prompts, job.tie_epsilon, job.min_agreement, **shapes)
        gate = GateResult.from_dict({**job.gate, **decode}).to_dict()
        return {**job.gate, **gate}, True
    log("  gate: teacher-forced agreement with the fp32 reference, then through the decode path")
    gate = evaluate_gate(engine, ref, eval_windows(tokenizer, job.eval_positions), prompts,
                         tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement, **shapes).to_dict()
    device_name = device.name if device is not None else "cpu"
    keep = tuple(job.keep) if job.keep is not None else None
    store_gate(gate_key(gate_inputs(checksum, eval_set_digest(job.eval_positions), engine.config,
                                    tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement,
                                    device=device_name, threads=job.threads, kept_layers=keep)), gate)
    return gate, False


def _gate_line(gate: dict) -> str:
    line = f"tie-aware {gate['tie_aware_agreement']:.4f}, raw {gate['raw_agreement']:.4f}, ppl {gate['perplexity']:.2f}"
    if gate.get("stopped_early"):
        return f"{line} after {gate['positions']} positions: stopped, a pass was out of reach (FAIL)"
    if gate.get("decode_agreement") is not None:
        line += (f"; decode {gate['decode_agreement']:.4f} over {gate['decode_positions']} positions of "
                 f"{gate['decode_prompts']} prompts, {gate['decode_verdict']}")
    return f"{line} ({'pass' if gate['passed'] else 'FAIL'})"


def quant_record(plan: QuantPlan | None, engine: Engine) -> dict:
    """What a trial stores of its quantize step: the plan's summary (method, calibration provenance, sensitivity)
    and what the build did (layers converted, layers kept)."""
    return {**(plan.summary if plan else {}), **engine.quantization}


def _trial(job: Job, spec: ModelSpec, tokenizer, device: Device | None, base_rss: int,
           checkpoint: Checkpoint) -> JobResult:
    config = DeployConfig.from_dict(job.config)
    workload = Workload(**job.workload)
    hf = load_hf_model(spec, "float32")
    log(f"  build {config.label()}")
    # Calibration, sensitivity: cached after the first trial. A recipe's own kept layers where it is re-measured.
    plan = quant_plan(hf, spec, tokenizer, config, tuple(job.keep) if job.keep is not None else None)
    engine = build_engine(hf, config, device=device, plan=plan)
    del hf
    result = JobResult(Status.OK, build_s=engine.build_seconds, quant=quant_record(plan, engine))
    timing = {"build_s": engine.build_seconds}
    t0 = time.perf_counter()
    gate, cached = _gate(job, engine, spec, tokenizer, device, workload)
    timing["gate_s"] = gate["seconds"] = time.perf_counter() - t0
    result.gate, result.gate_cached, result.timing = gate, cached, timing
    checkpoint({"gate": gate, "gate_cached": cached, "timing": timing, "build_s": engine.build_seconds})
    log(f"  gate: {_gate_line(gate)}")
    if not gate["passed"]:
        result.status = Status.GATED
        timing["compile_s"] = compile_seconds()
        return result
    log("  benchmark")
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    t0 = time.perf_counter()
    # A screening wave only where a front exists that could cut it.
    policy = policy_for(config.fusion_level, job.repeats, job.repeat_time_s, screen=bool(job.front))
    result.bench = benchmark_engine(engine, prompts, workload, policy=policy, base_rss=base_rss,
                                    device=device, cut=dominated_cut(job.front) if job.front else None)
    timing["bench_s"] = time.perf_counter() - t0
    timing["compile_s"] = compile_seconds()
    return result


_SHORT = {torch_name: name for name, torch_name in TORCH_DTYPE_NAMES.items()}


def _hf_baseline(job: Job, spec: ModelSpec, tokenizer, device: Device | None, base_rss: int,
                 checkpoint: Checkpoint) -> JobResult:
    workload = Workload(**job.workload)
    torch_name = auto_dtype(spec) if job.baseline_dtype == "auto" else TORCH_DTYPE_NAMES[job.baseline_dtype]
    hf = load_hf_model(spec, torch_name)
    if device is not None:
        hf = hf.to(device.torch_device)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bench = benchmark_hf_generate(hf, prompts, workload, job.baseline_batch, pad, base_rss=base_rss, device=device)
    dtype = _SHORT.get(torch_name, torch_name)
    how = f'dtype="auto" ({dtype})' if job.baseline_dtype == "auto" else dtype
    return JobResult(Status.OK, bench=bench, batch_size=job.baseline_batch, dtype=dtype,
                     what=f"transformers generate, {how}, eager, dynamic cache")


# One timed run on these CPUs drifts by up to about 20% (README, "Measured on this machine"): a configuration is
# clearly dominated only when a front point beats it by more than that on throughput and on TPOT p99, using no
# more memory. So a cut configuration is dominated on every objective and can never be on the front.
DOMINATED_MARGIN = 1.25


def dominated_cut(front: list[dict]):
    """The benchmark's `cut`: the first front point that clearly dominates the figures so far, as a reason."""
    def cut(figures: dict) -> str | None:
        for p in front:
            if (p["throughput_tok_s"] > DOMINATED_MARGIN * figures["throughput_tok_s"]
                    and p["tpot_p99_ms"] * DOMINATED_MARGIN < figures["tpot_p99_ms"]
                    and p["peak_memory_mb"] <= figures["peak_memory_mb"]):
                return (f"clearly dominated by trial #{p['number']} ({p['throughput_tok_s']:.1f} against "
                        f"{figures['throughput_tok_s']:.1f} tok/s, TPOT p99 {p['tpot_p99_ms']:.1f} against "
                        f"{figures['tpot_p99_ms']:.1f} ms, {p['peak_memory_mb']:.0f} against "
                        f"{figures['peak_memory_mb']:.0f} MB)")
        return None
    return cut


_HANDLERS = {JobKind.TRIAL: _trial, JobKind.REFERENCE: _reference, JobKind.HF_BASELINE: _hf_baseline}


def _no_checkpoint(partial: dict) -> None:
    return None


def run_job(job: Job, device: Device | None = None, checkpoint: Checkpoint = _no_checkpoint) -> JobResult:
    """Run a job in this process, on `device` (None: the CPU path of the engine). Expected failures
    (AutotuneError) come back as an ERROR result with the reason; anything else propagates to the caller.
    `checkpoint` is handed what the job has found before it is done (a trial's gate figures)."""
    if job.threads:
        torch.set_num_threads(job.threads)
    base_rss = rss_bytes()
    spec = resolve_model(job.model)
    tokenizer = load_tokenizer(spec)
    try:
        result = _HANDLERS[job.kind](job, spec, tokenizer, device, base_rss, checkpoint)
    except AutotuneError as exc:
        result = JobResult.error(str(exc))
    result.versions = _versions()
    result.threads = torch.get_num_threads()
    result.compile_cache = compiler_cache_counts()
    return result
