"""A llama.cpp trial in this process: the configuration's GGUF (made once), a context with its knobs, the gate on
its logits against the fp32 reference, then the benchmark on the study's workload. `python -m
autotune.llamacpp.trial ENVELOPE RESULT` runs one as the child of autotune/backends/isolated.py."""
from __future__ import annotations

import gc
import sys
import time

from autotune.benchmark.peak_rss import rss_bytes, trim_heap
from autotune.benchmark.policy import RunPolicy
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.gate.cache import gate_inputs, gate_key, store_gate
from autotune.gate.corpus import bench_prompts, decode_prompts, eval_set_digest, eval_windows
from autotune.gate.reference import cached_reference
from autotune.gate.result import GateResult
from autotune.host import num_cores
from autotune.llamacpp.bench import benchmark_llamacpp
from autotune.llamacpp.build_info import llamacpp_versions, numerics_versions, server_identity
from autotune.llamacpp.config import LlamaCppConfig
from autotune.llamacpp.engine import LlamaCppModel
from autotune.llamacpp.gate import llamacpp_decode_check, llamacpp_gate
from autotune.llamacpp.gguf_files import gguf_file
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.trial.child import Envelope, run_child
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["run_llamacpp_trial", "main", "GATE_DEVICE"]

# The device a llama.cpp gate is keyed under in the gate cache (and the backend's name).
GATE_DEVICE = "llamacpp"


def run_llamacpp_trial(job: Job) -> JobResult:
    """Build, gate, benchmark. `job.config` is a DeployConfig of the llamacpp runtime. Expected failures
    (AutotuneError: a type llama.cpp cannot make, a context that cannot be made, no KV room) come back as an ERROR
    result with the reason."""
    if job.kind is not JobKind.TRIAL:
        return JobResult.error(f"the llama.cpp trial runs trials, not {job.kind.value!r} jobs")
    try:
        return _trial(job)
    except AutotuneError as exc:
        return JobResult.error(str(exc))


def _trial(job: Job) -> JobResult:
    deploy = DeployConfig.from_dict(job.config)
    config = LlamaCppConfig.of(deploy)
    threads = config.threads or num_cores()
    workload = Workload(**job.workload)
    held = min(config.parallel, workload.num_requests)
    if config.n_ctx and held * workload.max_seq_len > config.n_ctx:
        # Known before anything is loaded: the gate's minutes are not spent on a context the benchmark cannot use.
        return JobResult(Status.INFEASIBLE, reason=f"n_ctx {config.n_ctx} cannot hold {held} sequences of up to "
                         f"{workload.max_seq_len} tokens (the workload's): it needs n_ctx >= "
                         f"{held * workload.max_seq_len}")
    spec = resolve_model(job.model)
    tokenizer = load_tokenizer(spec)
    checksum = model_checksum(spec)
    reference = cached_reference(checksum, tokenizer, job.eval_positions, lambda: load_hf_model(spec, "float32"))
    # The base is taken once a reference computed here (transformers' model, its scores) is freed and its pages
    # are back with the OS: the peak is then of llama.cpp's weights, KV cache and buffers alone.
    gc.collect()
    trim_heap()
    base_rss = rss_bytes()
    t0 = time.perf_counter()
    log(f"  build {config.label()}")
    model = LlamaCppModel(gguf_file(spec, checksum, config.gguf_type, threads))
    timing = {"build_s": time.perf_counter() - t0}
    result = JobResult(Status.OK, build_s=timing["build_s"], threads=threads, timing=timing,
                       versions={**llamacpp_versions(), **server_identity(model.path)},
                       what=config.server_command(str(model.path), threads))
    try:
        t0 = time.perf_counter()
        # The gate's context is freed before the benchmark's: its all-position logits are no part of serving.
        ctx = model.context(config, threads)
        try:
            prompts = decode_prompts(tokenizer, eval_positions=job.eval_positions)
            if job.gate is not None:  # the teacher-forced figures of these numerics, cached: decode check only
                decode = llamacpp_decode_check(ctx, reference, prompts, job.tie_epsilon, job.min_agreement)
                gate = {**job.gate, **GateResult.from_dict({**job.gate, **decode}).to_dict()}
            else:
                gate = llamacpp_gate(ctx, reference, eval_windows(tokenizer, job.eval_positions), prompts,
                                     tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement).to_dict()
                # Keyed as the study looks it up (autotune/study/loop.py), with llama.cpp's build for the versions.
                store_gate(gate_key(gate_inputs(checksum, eval_set_digest(job.eval_positions), deploy,
                                                tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement,
                                                device=GATE_DEVICE, threads=job.threads,
                                                versions=numerics_versions())), gate)
        finally:
            ctx.close()
        timing["gate_s"] = gate["seconds"] = time.perf_counter() - t0
        result.gate, result.gate_cached = gate, job.gate is not None
        log(f"  gate: tie-aware {gate['tie_aware_agreement']:.4f}, decode {gate.get('decode_agreement')}, "
            f"{'pass' if gate['passed'] else 'FAIL'}")
        if not gate["passed"]:
            result.status = Status.GATED
            return result
        log("  benchmark")
        t0 = time.perf_counter()
        ctx = model.context(config, threads)
        try:
            prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                                    workload.seed)
            policy = RunPolicy(warmup="short", max_repeats=job.repeats, time_cap_s=job.repeat_time_s)
            result.bench = benchmark_llamacpp(ctx, prompts, workload, base_rss=base_rss, policy=policy)
        finally:
            ctx.close()
        timing["bench_s"] = time.perf_counter() - t0
        return result
    finally:
        model.close()


def _run(envelope: Envelope) -> JobResult:
    return run_llamacpp_trial(envelope.job)


def main(argv: list[str]) -> int:
    return run_child(argv, _run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
