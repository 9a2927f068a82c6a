"""The sim backend: labelled results, infeasible trials, adapted spaces, and get_backend's --hardware."""
from __future__ import annotations

import pytest

from autotune.backends import get_backend
from autotune.backends.sim import SimBackend
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.errors import BackendUnavailable, UserInputError
from autotune.space.search_space import load_space
from autotune.trial.job import Job, Status

BENCH_KEYS = {"throughput_tok_s", "throughput_min", "throughput_max", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
              "tpot_p99_ms", "peak_memory_mb", "kv_reserved_peak_mb", "kv_pages_peak", "repeats", "warmup_s"}


def _job(config: DeployConfig, workload: Workload | None = None, model: str = "llama-7b") -> Job:
    return Job(kind="trial", model=model, workload=(workload or Workload()).to_dict(), config=config.to_dict())


def test_results_are_labelled_simulated_and_shaped_like_a_trial():
    backend = get_backend("sim", "ascend910")
    assert backend.measured is False
    result = backend.run(_job(DeployConfig(quant="w8a16", dtype="fp16")), timeout_s=10)
    assert result.status is Status.OK and result.source == "simulated"
    assert result.profile.startswith("ascend910 v")
    assert BENCH_KEYS <= set(result.bench)
    assert result.gate["measured"] is False
    assert backend.fingerprint()["simulated"] is True


def test_infeasible_and_unrunnable_jobs_come_back_with_reasons():
    backend = SimBackend("ascend910")
    big = Workload(num_requests=16, prompt_min=1024, prompt_max=1024, output_tokens=1024)
    result = backend.run(_job(DeployConfig(batch_size=16, kv_policy="preallocate", dtype="fp16"), big, "llama-13b"),
                         10)
    assert result.status is Status.INFEASIBLE and "GiB" in result.reason and result.source == "simulated"
    ref = backend.run(Job(kind="reference", model="llama-7b", workload=Workload().to_dict()), 10)
    assert ref.status is Status.ERROR


def test_space_adaptation_records_reasons():
    space = load_space()
    npu = SimBackend("ascend910").adapt_space(space)
    assert "device_power" not in {d.name for d in npu.dimensions}
    assert "clock" in npu.dropped["device_power"]
    gpu = SimBackend("h100").adapt_space(space)
    assert gpu.dimension("device_power").values == (1, 2, 4, 8)


def test_get_backend_hardware_rules():
    with pytest.raises(BackendUnavailable, match="--hardware"):
        get_backend("sim")
    with pytest.raises(UserInputError, match="sim backend only"):
        get_backend("cpu", "h100")
    with pytest.raises(UserInputError, match="unknown hardware profile"):
        get_backend("sim", "tpu-v9")
