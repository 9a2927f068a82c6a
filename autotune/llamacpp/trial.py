"""A llama.cpp trial in this process: the configuration's GGUF (made once), a context with its knobs, the gate on
its logits against the fp32 reference, then the benchmark on the study's workload. `python -m
autotune.llamacpp.trial ENVELOPE RESULT` runs one as the child of autotune/backends/isolated.py."""
from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

from autotune.benchmark.peak_rss import rss_bytes, trim_heap
from autotune.benchmark.peer import benchmark_peer
from autotune.benchmark.policy import RunPolicy
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.gate.corpus import bench_prompts, decode_prompts, eval_windows, holdout_prompts
from autotune.gate.peer import peer_decode_check, peer_gate
from autotune.gate.reference import cached_holdout_reference, cached_reference
from autotune.gate.result import GateResult
from autotune.host import num_cores
from autotune.llamacpp.build_info import llamacpp_versions, numerics_versions, server_identity
from autotune.llamacpp.config import llamacpp_config, server_command
from autotune.llamacpp.engine import LlamaCppModel
from autotune.llamacpp.gguf_files import gguf_file
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.trial.child import checkpoint_writer, run_child
from autotune.trial.job import Job, JobKind, JobResult, Status
from autotune.trial.pipeline import Checkpoint, run_trial

__all__ = ["GATE_DEVICE", "main", "run_llamacpp_trial"]

# The device a llama.cpp gate is keyed under in the gate cache (and the backend's name).
GATE_DEVICE = "llamacpp"


def run_llamacpp_trial(job: Job, checkpoint: Checkpoint = lambda found: None) -> JobResult:
    """Build, gate, benchmark (trial/pipeline.py). `job.config` is a DeployConfig of the llamacpp runtime. Expected
    failures (AutotuneError: a type llama.cpp cannot make, a context that cannot be made, no KV room) come back as
    an ERROR result with the reason. `checkpoint` is handed the gate figures before the benchmark."""
    if job.kind not in (JobKind.TRIAL, JobKind.HOLDOUT):
        return JobResult.error(f"the llama.cpp trial runs trials, not {job.kind.value!r} jobs")
    try:
        return run_trial(job, _LlamaCppStages(job), checkpoint)
    except AutotuneError as exc:
        return JobResult.error(str(exc))


class _LlamaCppStages:
    """llama.cpp's trial stages (trial/pipeline.py): the configuration's GGUF (made once) loaded, the gate on its
    logits in a context with the configuration's knobs, the benchmark in a fresh context."""

    device = GATE_DEVICE

    def __init__(self, job: Job) -> None:
        self.job = job
        self.config = llamacpp_config(job.config)
        self.threads = self.config.device_power or num_cores()
        self.workload = Workload(**job.workload)
        self.versions = numerics_versions()  # llama.cpp's build: its kernels decide the figures
        self.model: LlamaCppModel | None = None

    def build(self) -> JobResult:
        config, workload = self.config, self.workload
        held = min(config.batch_size, workload.num_requests)
        if config.n_ctx and held * workload.max_seq_len > config.n_ctx:
            # Known before anything is loaded: the gate's minutes are not spent on a context the benchmark cannot
            # use.
            return JobResult(Status.INFEASIBLE, reason=f"n_ctx {config.n_ctx} cannot hold {held} sequences of up to "
                             f"{workload.max_seq_len} tokens (the workload's): it needs n_ctx >= "
                             f"{held * workload.max_seq_len}")
        spec = resolve_model(self.job.model)
        self.tokenizer = load_tokenizer(spec)
        self.checksum = model_checksum(spec)
        self.reference = cached_reference(self.checksum, self.tokenizer, self.job.eval_positions,
                                          lambda: load_hf_model(spec, "float32"))
        # The base is taken once a reference computed here (transformers' model, its scores) is freed and its pages
        # are back with the OS: the peak is then of llama.cpp's weights, KV cache and buffers alone.
        gc.collect()
        trim_heap()
        self.base_rss = rss_bytes()
        t0 = time.perf_counter()
        log(f"  build {config.label()}")
        self.model = LlamaCppModel(gguf_file(spec, self.checksum, config.gguf_type, self.threads))
        return JobResult(Status.OK, build_s=time.perf_counter() - t0, threads=self.threads,
                         versions={**llamacpp_versions(), **server_identity(self.model.path)},
                         what=server_command(config, str(self.model.path), self.threads))

    def gate(self, cached: dict | None) -> dict:
        job = self.job
        # The gate's context is freed before the benchmark's: its all-position logits are no part of serving.
        ctx = self.model.context(self.config, self.threads)
        try:
            prompts = decode_prompts(self.tokenizer, eval_positions=job.eval_positions)
            if cached is not None:  # the teacher-forced figures of these numerics, cached: decode check only
                decode = peer_decode_check(ctx, self.reference, prompts, job.tie_epsilon, job.min_agreement)
                return {**cached, **GateResult.from_dict({**cached, **decode}).to_dict()}
            return peer_gate(ctx, self.reference, eval_windows(self.tokenizer, job.eval_positions), prompts,
                                 tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement).to_dict()
        finally:
            ctx.close()

    def holdout(self) -> dict:
        spec = resolve_model(self.job.model)
        reference = cached_holdout_reference(self.checksum, self.tokenizer, lambda: load_hf_model(spec, "float32"))
        ctx = self.model.context(self.config, self.threads)
        try:
            return peer_decode_check(ctx, reference, holdout_prompts(self.tokenizer), self.job.tie_epsilon,
                                         self.job.min_agreement)
        finally:
            ctx.close()

    def bench(self) -> dict:
        workload = self.workload
        ctx = self.model.context(self.config, self.threads)
        try:
            prompts = bench_prompts(self.tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                                    workload.seed)
            policy = RunPolicy(warmup="short", max_repeats=self.job.repeats, time_cap_s=self.job.repeat_time_s)
            return benchmark_peer(ctx, prompts, workload, base_rss=self.base_rss, policy=policy)
        finally:
            ctx.close()

    def timing(self) -> dict:
        return {}

    def close(self) -> None:
        if self.model is not None:
            self.model.close()


def main(argv: list[str]) -> int:
    # The checkpoint file sits beside the result file (argv[1]): a trial stopped at its limit keeps its gate.
    return run_child(argv, lambda envelope: run_llamacpp_trial(envelope.job, checkpoint_writer(Path(argv[1]))))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
