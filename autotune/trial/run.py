"""One job in this process: a trial (build the configuration, pass the gate, benchmark), the reference, or the
speed baseline. The device it builds on is given by the caller (autotune/trial/child.py); None is the CPU path."""
from __future__ import annotations

import platform
import time
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version

import torch
import transformers

from autotune.benchmark.bench import benchmark_engine, benchmark_hf_generate
from autotune.benchmark.peak_rss import rss_bytes
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.devices.base import Device
from autotune.engine import build_engine
from autotune.errors import AutotuneError
from autotune.gate.accuracy import Reference, compute_reference, evaluate_gate
from autotune.gate.cache import gate_key, reference_path, store_gate
from autotune.gate.corpus import bench_prompts, drift_prompts, eval_set_digest, eval_windows
from autotune.models.registry import ModelSpec, resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.trial.compiler_cache import compiler_cache_counts
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["run_job"]


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for package in ("torchao", "optuna"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:  # a missing optional package only leaves its version out
            pass
    return out


def _reference(job: Job, spec: ModelSpec, tokenizer, device: Device | None, base_rss: int) -> JobResult:
    path = reference_path(model_checksum(spec), eval_set_digest(job.eval_positions))
    if not path.is_file():
        hf = load_hf_model(spec, "float32")
        ref = compute_reference(hf, eval_windows(tokenizer, job.eval_positions), drift_prompts(tokenizer),
                                job.drift_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(asdict(ref), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
    return JobResult(Status.OK, path=str(path))


def _trial(job: Job, spec: ModelSpec, tokenizer, device: Device | None, base_rss: int) -> JobResult:
    config = DeployConfig(**job.config)
    workload = Workload(**job.workload)
    hf = load_hf_model(spec, "float32")
    log(f"  build {config.label()}")
    engine = build_engine(hf, config, device=device)
    del hf
    result = JobResult(Status.OK, build_s=engine.build_seconds)
    checksum, digest = model_checksum(spec), eval_set_digest(job.eval_positions)
    if job.gate is None:
        log("  gate: teacher-forced agreement with the fp32 reference")
        t0 = time.perf_counter()
        ref = Reference(**torch.load(reference_path(checksum, digest)))
        gate = evaluate_gate(engine, ref, eval_windows(tokenizer, job.eval_positions), drift_prompts(tokenizer),
                             tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement,
                             max_seq_len=workload.max_seq_len).to_dict()
        gate["seconds"] = time.perf_counter() - t0
        device_name = device.name if device is not None else "cpu"
        store_gate(gate_key(checksum, digest, config.numerics_key(), job.tie_epsilon, device_name), gate)
        result.gate, result.gate_cached = gate, False
        log(f"  gate: tie-aware {gate['tie_aware_agreement']:.4f}, raw {gate['raw_agreement']:.4f}, "
            f"ppl {gate['perplexity']:.2f} ({'pass' if gate['passed'] else 'FAIL'})")
        if not gate["passed"]:
            result.status = Status.GATED
            return result
    else:
        result.gate, result.gate_cached = job.gate, True
    log("  benchmark")
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    result.bench = benchmark_engine(engine, prompts, workload, repeats=job.repeats, base_rss=base_rss,
                                    device=device)
    return result


def _hf_baseline(job: Job, spec: ModelSpec, tokenizer, device: Device | None, base_rss: int) -> JobResult:
    workload = Workload(**job.workload)
    hf = load_hf_model(spec, "bfloat16")
    if device is not None:
        hf = hf.to(device.torch_device)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bench = benchmark_hf_generate(hf, prompts, workload, job.baseline_batch, pad, repeats=job.repeats,
                                  base_rss=base_rss, device=device)
    return JobResult(Status.OK, bench=bench, batch_size=job.baseline_batch,
                     what="transformers generate, bf16, eager, dynamic cache")


_HANDLERS = {JobKind.TRIAL: _trial, JobKind.REFERENCE: _reference, JobKind.HF_BASELINE: _hf_baseline}


def run_job(job: Job, device: Device | None = None) -> JobResult:
    """Run a job in this process, on `device` (None: the CPU path of the engine). Expected failures
    (AutotuneError) come back as an ERROR result with the reason; anything else propagates to the caller."""
    if job.threads:
        torch.set_num_threads(job.threads)
    base_rss = rss_bytes()
    spec = resolve_model(job.model)
    tokenizer = load_tokenizer(spec)
    try:
        result = _HANDLERS[job.kind](job, spec, tokenizer, device, base_rss)
    except AutotuneError as exc:
        result = JobResult.error(str(exc))
    result.versions = _versions()
    result.threads = torch.get_num_threads()
    result.compile_cache = compiler_cache_counts()
    return result
