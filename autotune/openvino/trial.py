"""An OpenVINO trial in this process: the configuration's IR (exported and compressed once), a pipeline with its
knobs, the gate on OpenVINO's own logits and decode against the fp32 reference, then the benchmark on the study's
workload. `python -m autotune.openvino.trial ENVELOPE RESULT` runs one as the child of autotune/backends/isolated.py."""
from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

from autotune.benchmark.goodput import measure_goodput
from autotune.benchmark.peak_rss import rss_bytes, trim_heap
from autotune.benchmark.peer import benchmark_peer
from autotune.benchmark.policy import RunPolicy
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.gate.corpus import bench_prompts, decode_prompts, eval_windows, holdout_prompts
from autotune.gate.peer import peer_decode_check, peer_gate
from autotune.gate.reference import cached_holdout_reference, cached_reference
from autotune.gate.result import GateResult
from autotune.host import num_cores
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.openvino.build_info import numerics_versions, openvino_versions
from autotune.openvino.config import openvino_config
from autotune.openvino.ir_files import SAMPLES, ir_folder
from autotune.openvino.pipeline import OpenVinoPipeline, plugin_properties
from autotune.progress import log
from autotune.quant.calib_set import calibration_samples
from autotune.trial.child import checkpoint_writer, run_child
from autotune.trial.job import Job, JobKind, JobResult, Status
from autotune.trial.pipeline import Checkpoint, run_trial

__all__ = ["run_openvino_trial", "main", "GATE_DEVICE"]

# The device an OpenVINO gate is keyed under in the gate cache (and the backend's name).
GATE_DEVICE = "openvino"


def run_openvino_trial(job: Job, checkpoint: Checkpoint = lambda found: None) -> JobResult:
    """Build, gate, benchmark (trial/pipeline.py). `job.config` is a DeployConfig of the openvino runtime. Expected
    failures (AutotuneError: an export or compression that fails, a pipeline OpenVINO cannot make) come back as an
    ERROR result with the reason. `checkpoint` is handed the gate figures before the benchmark."""
    if job.kind not in (JobKind.TRIAL, JobKind.HOLDOUT):
        return JobResult.error(f"the OpenVINO trial runs trials, not {job.kind.value!r} jobs")
    try:
        return run_trial(job, _OpenVinoStages(job), checkpoint)
    except AutotuneError as exc:
        return JobResult.error(str(exc))


class _OpenVinoStages:
    """OpenVINO's trial stages (trial/pipeline.py): the configuration's IR (made once) and a pipeline of its knobs;
    the gate's windows through the IR's stateful model, its decode check and the benchmark through the pipeline."""

    device = GATE_DEVICE

    def __init__(self, job: Job) -> None:
        self.job = job
        self.config = openvino_config(job.config)
        self.threads = self.config.device_power or num_cores()
        self.workload = Workload(**job.workload)
        self.versions = numerics_versions()
        self.pipeline: OpenVinoPipeline | None = None

    def build(self) -> JobResult:
        config = self.config
        spec = resolve_model(self.job.model)
        self.tokenizer = load_tokenizer(spec)
        self.checksum = model_checksum(spec)
        self.reference = cached_reference(self.checksum, self.tokenizer, self.job.eval_positions,
                                          lambda: load_hf_model(spec, "float32"))
        samples = calibration_samples(self.tokenizer, SAMPLES) if config.knobs.reads_calibration() else None
        t0 = time.perf_counter()
        log(f"  build {config.label()}")
        folder = ir_folder(spec, self.checksum, config.knobs, samples)
        export_s = time.perf_counter() - t0
        # The base is taken once the reference's model is freed and the export's child is gone: the peak is then of
        # OpenVINO's weights, KV cache and buffers alone.
        gc.collect()
        trim_heap()
        self.base_rss = rss_bytes()
        self.pipeline = OpenVinoPipeline(folder, config, self.threads)
        return JobResult(Status.OK, build_s=time.perf_counter() - t0, threads=self.threads,
                         versions=openvino_versions(),
                         what=f"ContinuousBatchingPipeline({folder}, properties "
                              f"{plugin_properties(config, self.threads)})",
                         build={"artifact": "openvino-ir", "ir": str(folder), "export_s": round(export_s, 1)})

    def gate(self, cached: dict | None) -> dict:
        job, pipeline = self.job, self.pipeline
        try:
            prompts = decode_prompts(self.tokenizer, eval_positions=job.eval_positions)
            if cached is not None:  # the teacher-forced figures of these numerics, cached: decode check only
                decode = peer_decode_check(pipeline, self.reference, prompts, job.tie_epsilon, job.min_agreement)
                return {**cached, **GateResult.from_dict({**cached, **decode}).to_dict()}
            return peer_gate(pipeline, self.reference, eval_windows(self.tokenizer, job.eval_positions), prompts,
                             tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement).to_dict()
        finally:
            pipeline.drop_stateful()

    def holdout(self) -> dict:
        spec = resolve_model(self.job.model)
        reference = cached_holdout_reference(self.checksum, self.tokenizer, lambda: load_hf_model(spec, "float32"))
        return peer_decode_check(self.pipeline, reference, holdout_prompts(self.tokenizer), self.job.tie_epsilon,
                                 self.job.min_agreement)

    def bench(self) -> dict:
        workload = self.workload
        prompts = bench_prompts(self.tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                                workload.seed)
        policy = RunPolicy(warmup="short", max_repeats=self.job.repeats, time_cap_s=self.job.repeat_time_s)
        return benchmark_peer(self.pipeline, prompts, workload, base_rss=self.base_rss, policy=policy)

    def goodput(self, slo: Slo, bench: dict, budget_s: float) -> dict:
        """The pipeline is the step runner OpenVINO recipes are served with (autotune serve): the same scheduler."""
        def prompts(w: Workload) -> list[list[int]]:
            return bench_prompts(self.tokenizer, w.num_requests, w.prompt_min, w.prompt_max, w.seed)

        return measure_goodput(self.pipeline, prompts, self.workload, slo, bench["throughput_tok_s"],
                               budget_s=budget_s)

    def timing(self) -> dict:
        return {}

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()


def main(argv: list[str]) -> int:
    # The checkpoint file sits beside the result file (argv[1]): a trial stopped at its limit keeps its gate.
    return run_child(argv, lambda envelope: run_openvino_trial(envelope.job, checkpoint_writer(Path(argv[1]))))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
