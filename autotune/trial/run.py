"""One job in this process: a trial (build the configuration, pass the gate, benchmark), the reference, or the
speed baseline. The device it builds on is given by the caller (autotune/trial/__main__.py): the CPU is one too."""
from __future__ import annotations

import platform
import time
from importlib.metadata import PackageNotFoundError, version

import torch
import transformers

from autotune.benchmark.bench import benchmark_engine, benchmark_hf_generate
from autotune.benchmark.goodput import measure_goodput
from autotune.benchmark.peak_rss import rss_bytes
from autotune.benchmark.policy import policy_for
from autotune.config.deploy import TORCH_DTYPE_NAMES, DeployConfig
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.devices.base import Device
from autotune.devices.kept_packages import kept_packages
from autotune.engine import Engine
from autotune.engine.calibrated import QuantPlan
from autotune.engine.compiler_cache import compile_seconds, compiler_cache_counts
from autotune.engine.serving import serving_runner
from autotune.errors import AutotuneError
from autotune.gate.accuracy import GateResult, decode_check, evaluate_gate
from autotune.gate.cache import reference_path
from autotune.gate.corpus import bench_prompts, decode_prompts, eval_set_digest, eval_windows, holdout_prompts
from autotune.gate.reference import cached_holdout_reference, cached_reference
from autotune.models.registry import ModelSpec, resolve_model
from autotune.models.weights import auto_dtype, load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.quant.plan import quant_plan
from autotune.trial.job import Job, JobKind, JobResult, Status
from autotune.trial.pipeline import Checkpoint, run_trial

__all__ = ["run_job", "Checkpoint"]



def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for package in ("torchao", "optuna"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:  # a missing optional package only leaves its version out
            pass
    return out


def _reference(job: Job, spec: ModelSpec, tokenizer, device: Device, base_rss: int,
               checkpoint: Checkpoint) -> JobResult:
    cached_reference(model_checksum(spec), tokenizer, job.eval_positions, lambda: load_hf_model(spec, "float32"))
    return JobResult(Status.OK, path=str(reference_path(model_checksum(spec), eval_set_digest(job.eval_positions))))


def quant_record(plan: QuantPlan | None, engine: Engine) -> dict:
    """What a trial stores of its quantize step: the plan's summary (method, calibration provenance, sensitivity)
    and what the build did (layers converted, layers kept)."""
    return {**(plan.summary if plan else {}), **engine.quantization}


class _EngineStages:
    """The engine's trial stages (trial/pipeline.py): build on `device`, the gate against the
    fp32 reference through the engine, the benchmark of its runner."""

    versions = None  # torch's stack: gate/cache.numerics_versions

    def __init__(self, job: Job, spec: ModelSpec, tokenizer, device: Device, base_rss: int) -> None:
        self.job, self.spec, self.tokenizer, self.base_rss = job, spec, tokenizer, base_rss
        self.torch_device = device
        self.device = device.name
        self.config = DeployConfig.from_dict(job.config)
        self.workload = Workload(**job.workload)
        self.checksum = model_checksum(spec)
        self.engine: Engine | None = None

    def build(self) -> JobResult:
        hf = load_hf_model(self.spec, "float32")
        log(f"  build {self.config.label()}")
        # Calibration, sensitivity: cached after the first trial. A recipe's own kept layers where it is re-measured.
        plan = quant_plan(hf, self.spec, self.tokenizer, self.config,
                          tuple(self.job.keep) if self.job.keep is not None else None)
        # O2 on the CPU: the packages are kept by what was built, so that serving the recipe loads them.
        packages = kept_packages(self.spec, self.config, plan.keep if plan else (), self.device)
        self.engine = self.torch_device.build(hf, self.config, plan=plan, packages=packages)
        del hf
        return JobResult(Status.OK, build_s=self.engine.build_seconds, quant=quant_record(plan, self.engine),
                         build=self.engine.build_record)

    def gate(self, cached: dict | None) -> dict:
        """The decode check runs in every trial: it is of this configuration's decode path (batch size, page size),
        which the numerics key that the cache is keyed by does not hold."""
        job = self.job
        ref = cached_reference(self.checksum, self.tokenizer, job.eval_positions,
                               lambda: load_hf_model(self.spec, "float32"))
        prompts = decode_prompts(self.tokenizer, eval_positions=job.eval_positions)
        shapes = self._shapes()
        if cached is not None:
            log("  gate: teacher-forced figures of these numerics cached; decode check through this configuration")
            decode = decode_check(self.engine, ref, prompts, job.tie_epsilon, job.min_agreement, **shapes)
            return {**cached, **GateResult.from_dict({**cached, **decode}).to_dict()}
        log("  gate: teacher-forced agreement with the fp32 reference, then through the decode path")
        return evaluate_gate(self.engine, ref, eval_windows(self.tokenizer, job.eval_positions), prompts,
                             tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement, **shapes).to_dict()

    def _shapes(self) -> dict:
        # The benchmark's runner shapes: the decode graphs compiled here are the ones the benchmark runs.
        return dict(max_seq_len=self.workload.max_seq_len,
                    pool_tokens=self.config.batch_size * self.workload.max_seq_len)

    def holdout(self) -> dict:
        ref = cached_holdout_reference(self.checksum, self.tokenizer, lambda: load_hf_model(self.spec, "float32"))
        return decode_check(self.engine, ref, holdout_prompts(self.tokenizer), self.job.tie_epsilon,
                            self.job.min_agreement, **self._shapes())

    def bench(self) -> dict:
        job, workload = self.job, self.workload
        prompts = bench_prompts(self.tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                                workload.seed)
        # A screening wave only where a front exists that could cut it.
        policy = policy_for(self.config.fusion_level, job.repeats, job.repeat_time_s, screen=bool(job.front))
        return benchmark_engine(self.engine, prompts, workload, policy=policy, base_rss=self.base_rss,
                                device=self.torch_device, cut=dominated_cut(job.front) if job.front else None)

    def goodput(self, slo: Slo, bench: dict, budget_s: float) -> dict:
        workload = self.workload
        runner = serving_runner(self.engine, workload.max_seq_len)
        t0 = time.perf_counter()
        runner.warm_up()  # the serving graphs (decode buckets, chunked prefill), as a first start compiles them
        warm_s = time.perf_counter() - t0
        out = measure_goodput(runner, lambda w: _prompts(self.tokenizer, w), workload, slo,
                              bench["throughput_tok_s"], budget_s=budget_s, eos_token_id=self.engine.model.eos_token_id)
        return {**out, "warmup_s": warm_s}

    def timing(self) -> dict:
        # dynamo's timers (O1's torch.compile), and O2's torch.export + AOTInductor packages, which they miss.
        packaged = getattr(self.engine, "packaged", None)
        return {"compile_s": compile_seconds() + (packaged.compile_seconds if packaged is not None else 0.0)}

    def close(self) -> None:
        self.engine = None


def _prompts(tokenizer, workload: Workload) -> list[list[int]]:
    return bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)


def _trial(job: Job, spec: ModelSpec, tokenizer, device: Device, base_rss: int,
           checkpoint: Checkpoint) -> JobResult:
    return run_trial(job, _EngineStages(job, spec, tokenizer, device, base_rss), checkpoint)


_SHORT = {torch_name: name for name, torch_name in TORCH_DTYPE_NAMES.items()}


def _hf_baseline(job: Job, spec: ModelSpec, tokenizer, device: Device, base_rss: int,
                 checkpoint: Checkpoint) -> JobResult:
    workload = Workload(**job.workload)
    torch_name = auto_dtype(spec) if job.baseline_dtype == "auto" else TORCH_DTYPE_NAMES[job.baseline_dtype]
    hf = load_hf_model(spec, torch_name).to(device.torch_device)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bench = benchmark_hf_generate(hf, prompts, workload, job.baseline_batch, pad, base_rss=base_rss, device=device)
    dtype = _SHORT.get(torch_name, torch_name)
    how = f'dtype="auto" ({dtype})' if job.baseline_dtype == "auto" else dtype
    return JobResult(Status.OK, bench=bench, batch_size=job.baseline_batch, dtype=dtype,
                     what=f"transformers generate, {how}, eager, dynamic cache")


# One timed run on these CPUs drifts by up to about 20% (docs/measurements.md, its opening): a configuration is
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


_HANDLERS = {JobKind.TRIAL: _trial, JobKind.HOLDOUT: _trial, JobKind.REFERENCE: _reference,
             JobKind.HF_BASELINE: _hf_baseline}


def _no_checkpoint(partial: dict) -> None:
    return None


def run_job(job: Job, device: Device, checkpoint: Checkpoint = _no_checkpoint) -> JobResult:
    """Run a job in this process, on `device` (autotune/devices/). Expected failures
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
