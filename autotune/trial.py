"""One trial, in its own process: build the configuration, pass the gate, benchmark. Also the reference and
the speed-baseline jobs. Run as `python -m autotune.trial JOB.json RESULT.json`."""
from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

__all__ = ["Job", "run_job"]


@dataclass(slots=True)
class Job:
    """kind: "trial" (build, gate unless `gate` is given, benchmark), "reference" or "hf_baseline"."""

    kind: str
    model: str
    workload: dict
    config: dict = field(default_factory=dict)
    threads: int = 0
    min_agreement: float = 0.995
    tie_epsilon: float = 0.05
    eval_positions: int = 4096
    drift_tokens: int = 128
    repeats: int = 3
    gate: dict | None = None  # cached gate figures for these numerics: skip the gate
    baseline_batch: int = 8
    # Set when an in-process backend (the simulator) has its trials isolated: the child runs that backend.
    backend: str = ""
    hardware: str | None = None
    memory_limit_mb: float | None = None  # address-space limit of the child process (None: unlimited)
    # Where the engine is built and measured: "cpu" (this process, as always), "cuda" or "npu" (set by those
    # backends; autotune/backends/device.py).
    device: str = "cpu"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _versions() -> dict:
    import platform

    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        from importlib.metadata import version

        out["torchao"] = version("torchao")
        out["optuna"] = version("optuna")
    except Exception:  # noqa: BLE001 - a missing optional package only leaves its version out
        pass
    return out


def _reference(job: Job, spec, tokenizer) -> dict:
    import torch

    from autotune.accuracy import compute_reference
    from autotune.corpus import drift_prompts, eval_set_digest, eval_windows
    from autotune.gatecache import reference_path
    from autotune.weights import load_hf_model, model_checksum

    path = reference_path(model_checksum(spec), eval_set_digest(job.eval_positions))
    if not path.is_file():
        hf = load_hf_model(spec, "float32")
        ref = compute_reference(hf, eval_windows(tokenizer, job.eval_positions), drift_prompts(tokenizer),
                                job.drift_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(asdict(ref), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
    return {"status": "ok", "path": str(path)}


def _device(job: Job):
    """The accelerator Device of a job; None on the CPU, whose path does not go through one."""
    if job.device == "cpu":
        return None
    from autotune.backends.device import get_device

    return get_device(job.device)


def _trial(job: Job, spec, tokenizer, base_rss: int) -> dict:
    import torch

    from autotune.accuracy import Reference, evaluate_gate
    from autotune.bench import benchmark_engine
    from autotune.config import DeployConfig
    from autotune.corpus import bench_prompts, drift_prompts, eval_set_digest, eval_windows
    from autotune.engine import build_engine
    from autotune.gatecache import gate_key, reference_path, store_gate
    from autotune.progress import log
    from autotune.weights import load_hf_model, model_checksum
    from autotune.workload import Workload

    config = DeployConfig(**job.config)
    workload = Workload(**job.workload)
    hf = load_hf_model(spec, "float32")
    log(f"  build {config.label()}")
    device = _device(job)
    engine = build_engine(hf, config, device=device)
    del hf
    result: dict = {"build_s": engine.build_seconds}
    checksum, digest = model_checksum(spec), eval_set_digest(job.eval_positions)
    if job.gate is None:
        log("  gate: teacher-forced agreement with the fp32 reference")
        t0 = time.perf_counter()
        ref = Reference(**torch.load(reference_path(checksum, digest)))
        gate = evaluate_gate(engine, ref, eval_windows(tokenizer, job.eval_positions), drift_prompts(tokenizer),
                             tie_epsilon=job.tie_epsilon, min_agreement=job.min_agreement,
                             max_seq_len=workload.max_seq_len).to_dict()
        gate["seconds"] = time.perf_counter() - t0
        store_gate(gate_key(checksum, digest, config.numerics_key(), job.tie_epsilon, job.device), gate)
        result["gate"], result["gate_cached"] = gate, False
        log(f"  gate: tie-aware {gate['tie_aware_agreement']:.4f}, raw {gate['raw_agreement']:.4f}, "
            f"ppl {gate['perplexity']:.2f} ({'pass' if gate['passed'] else 'FAIL'})")
        if not gate["passed"]:
            return {**result, "status": "gated"}
    else:
        result["gate"], result["gate_cached"] = job.gate, True
    log("  benchmark")
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    result["bench"] = benchmark_engine(engine, prompts, workload, repeats=job.repeats, base_rss=base_rss,
                                       device=device)
    return {**result, "status": "ok"}


def _hf_baseline(job: Job, spec, tokenizer, base_rss: int) -> dict:
    from autotune.bench import benchmark_hf_generate
    from autotune.corpus import bench_prompts
    from autotune.weights import load_hf_model
    from autotune.workload import Workload

    workload = Workload(**job.workload)
    hf = load_hf_model(spec, "bfloat16")
    device = _device(job)
    if device is not None:
        hf = hf.to(device.torch_device)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bench = benchmark_hf_generate(hf, prompts, workload, job.baseline_batch, pad, repeats=job.repeats,
                                  base_rss=base_rss, device=device)
    return {"status": "ok", "bench": bench, "batch_size": job.baseline_batch,
            "what": "transformers generate, bf16, eager, dynamic cache"}


def run_job(job: Job) -> dict:
    """Run a job in this process; expected failures come back as {"status": "error", "reason": ...}."""
    import torch

    from autotune.errors import AutotuneError
    from autotune.memory import rss_bytes
    from autotune.models import resolve_model
    from autotune.weights import load_tokenizer

    if job.threads:
        torch.set_num_threads(job.threads)
    base_rss = rss_bytes()
    spec = resolve_model(job.model)
    tokenizer = load_tokenizer(spec)
    try:
        handler = {"trial": _trial, "reference": lambda j, s, t, b: _reference(j, s, t),
                   "hf_baseline": _hf_baseline}[job.kind]
        result = handler(job, spec, tokenizer, base_rss)
    except AutotuneError as exc:
        result = {"status": "error", "reason": str(exc)}
    from autotune.caches import compiler_cache_counts

    result["versions"] = _versions()
    result["threads"] = torch.get_num_threads()
    result["compile_cache"] = compiler_cache_counts()
    return result


def _run_backend_job(job: Job) -> dict:
    """The child side of an isolated in-process backend (autotune/backends/isolated.py IsolatedBackend)."""
    from autotune.backends import get_backend

    return get_backend(job.backend, job.hardware).run(job, float("inf"))


def limit_memory(limit_mb: float | None) -> None:
    """RLIMIT_AS: an allocation past the limit fails inside this process (MemoryError, failed malloc) instead of
    waking the machine's OOM killer, which might pick the worker or the database. Set here rather than in a
    preexec_fn, which is unsafe in a parent with threads (the worker's heartbeat)."""
    if limit_mb:
        import resource

        limit = int(limit_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str]) -> int:
    job = Job(**json.loads(open(argv[0]).read()))
    limit_memory(job.memory_limit_mb)
    try:
        result = _run_backend_job(job) if job.backend else run_job(job)
    except MemoryError:
        traceback.print_exc()
        limit = f" of {job.memory_limit_mb:.0f} MB" if job.memory_limit_mb else ""
        result = {"status": "error", "reason": f"out of memory: the trial exceeded its memory limit{limit} "
                                               "(MemoryError)"}
    except Exception as exc:  # noqa: BLE001 - any failure of a build is this trial's failure, with its reason
        traceback.print_exc()
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
            result["reason"] = f"out of memory: {result['reason']}"
    with open(argv[1], "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
