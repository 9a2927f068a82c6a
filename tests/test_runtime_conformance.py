"""One contract, every runtime (as Optuna runs every storage through the same tests): each runtime here (autotune's
engine, OpenVINO, llama.cpp where installed) is run through the cpu backend on a tiny peaked LLaMA, with its own
full-precision configuration, and must behave alike: its knobs round-trip and keep their digest, its gate figures
are stored under the key the study looks them up by, a faithful build passes the gate and is benchmarked with the
same figures, a held-back job returns decode figures, a bad job is an error result, and nothing a trial started
outlives its limit."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from autotune.backends.cpu import CpuBackend
from autotune.backends.launch import TOKEN_ENV
from autotune.config.deploy import DeployConfig
from autotune.config.slo import Slo
from autotune.gate.cache import load_gate
from autotune.gate.corpus import eval_set_digest
from autotune.models.registry import resolve_model
from autotune.models.weights import model_checksum
from autotune.trial.gate_key import trial_gate_key
from autotune.trial.job import Job, JobKind, Status
from tests.conftest import make_tiny_llama

# Each runtime's full-precision configuration on one thread (what a tiny peaked model passes the gate in), and the
# digest its knobs must keep (recipes are named by it).
CASES = {
    "engine": (dict(dtype="fp32", batch_size=2, device_power=1), "d29c7da42577"),
    "openvino": (dict(runtime="openvino", weight_format="fp32", inference_precision="f32", kv_precision="f32",
                      batch_size=2, device_power=1), "605db1b3fcd4"),
    "llamacpp": (dict(runtime="llamacpp", gguf_type="source", batch_size=2, device_power=1, n_ctx=2048),
                 "8988d5f39fd3"),
}
WORKLOAD = dict(num_requests=4, prompt_min=20, prompt_max=30, output_tokens=8)



@pytest.fixture(params=sorted(CASES))
def runtime(request) -> str:
    why = CpuBackend().runtimes_here()[request.param]
    if why:
        pytest.skip(f"runtime {request.param} cannot run here: {why}")
    return request.param


def _config(runtime: str) -> DeployConfig:
    return DeployConfig(**CASES[runtime][0])


def test_knobs_round_trip_and_keep_their_digest(runtime):
    config = _config(runtime)
    assert config.runtime == runtime
    assert DeployConfig.from_dict(config.to_dict()) == config
    assert config.digest() == CASES[runtime][1], config.digest()


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, smollm2_folder) -> Path:
    """The tiny peaked LLaMA as a folder model (SmolLM2's tokenizer), with its F32 GGUF beside it for llama.cpp."""
    folder = tmp_path_factory.mktemp("conformance-model")
    tiny = make_tiny_llama(vocab_size=49152)
    tiny.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, folder / name)
    if CpuBackend().runtimes_here()["llamacpp"] is None:
        from autotune.llamacpp.gguf_files import source_gguf
        from tests.llamacpp_factory import write_gguf

        write_gguf(tiny, folder / "model-f32.gguf", source_gguf(resolve_model("smollm2-135m")))
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of this module's own (OpenVINO's export environment shared with the user's by a link: a minute of
    pip, the same pins)."""
    root = tmp_path_factory.mktemp("conformance-cache")
    if CpuBackend().runtimes_here()["openvino"] is None:
        from autotune.openvino.export_env import export_python

        shared = export_python().parent.parent
        (root / "openvino").mkdir()
        (root / "openvino" / shared.name).symlink_to(shared)
    old = os.environ.get("AUTOTUNE_CACHE")
    os.environ["AUTOTUNE_CACHE"] = str(root)
    yield root
    if old is None:
        del os.environ["AUTOTUNE_CACHE"]
    else:
        os.environ["AUTOTUNE_CACHE"] = old


def _job(runtime: str, folder: Path, kind: JobKind = JobKind.TRIAL, **changes) -> Job:
    config = _config(runtime)
    return Job(kind=kind, model=str(folder), config=config.to_dict(), threads=config.device_power, repeats=1,
               eval_positions=1024, workload=WORKLOAD, **changes)


@pytest.mark.slow
def test_a_faithful_build_is_gated_under_the_studys_key_and_benchmarked_alike(runtime, model_folder, cache):
    backend = CpuBackend()
    job = _job(runtime, model_folder)
    result = backend.run(job, timeout_s=900)
    assert result.status is Status.OK, (result.reason, result.log_tail)
    assert result.gate["passed"] and result.gate["tie_aware_agreement"] > 0.995 and result.gate["decode_positions"]
    # The figures every runtime's benchmark gives, by the same names.
    assert {"throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "peak_memory_mb",
            "repeats"} <= set(result.bench) and result.bench["throughput_tok_s"] > 0
    # The study finds the child's gate figures under the key it computes itself (study/loop.py _evaluate).
    device, versions = backend.gate_identity(_config(runtime))
    key = trial_gate_key(job, checksum=model_checksum(resolve_model(str(model_folder))), device=device,
                         versions=versions, eval_digest=eval_set_digest(job.eval_positions))
    stored = load_gate(key)
    assert stored is not None and stored["tie_aware_agreement"] == result.gate["tie_aware_agreement"]


@pytest.mark.slow
def test_a_job_with_an_slo_measures_goodput_on_the_serving_path(runtime, model_folder, cache):
    """Open-loop runs at the rates the search picks, through the runtime's step runner (what `autotune serve` drives):
    under a loose SLO the tiny model meets it; every rate tried is kept with its attainment."""
    result = CpuBackend().run(_job(runtime, model_folder, slo=Slo(5000.0, 1000.0).to_dict()), timeout_s=900)
    assert result.status is Status.OK, (result.reason, result.log_tail)
    goodput = result.goodput
    if runtime == "llamacpp":  # its context is not a step runner: said, not measured
        assert goodput["goodput_req_s"] == 0.0 and "not measured" in goodput["note"]
        return
    assert goodput["met"] and goodput["goodput_req_s"] >= goodput["start_rate"] > 0, goodput
    assert result.bench["goodput_req_s"] == goodput["goodput_req_s"] and result.bench["goodput_tok_s"] > 0
    rates = goodput["rates"]
    assert rates and all(0.0 <= r["attainment"] <= 1.0 and r["counted"] > 0 for r in rates)
    assert rates[0]["rate"] == goodput["start_rate"] and result.timing["goodput_s"] > 0


@pytest.mark.slow
def test_a_held_back_job_returns_decode_figures(runtime, model_folder, cache):
    result = CpuBackend().run(_job(runtime, model_folder, JobKind.HOLDOUT), timeout_s=900)
    assert result.status is Status.OK, (result.reason, result.log_tail)
    held = result.holdout
    assert held["decode_positions"] > 0 and held["decode_passed"] and held["decode_verdict"]
    assert result.gate is None and result.bench is None  # the held-back check alone: no gate, no benchmark


@pytest.mark.slow
def test_a_bad_job_of_the_runtime_is_an_error_result(runtime, cache, tmp_path):
    result = CpuBackend().run(_job(runtime, tmp_path / "no-such-model"), timeout_s=300)
    assert result.status is Status.ERROR and result.reason and "no-such-model" in result.reason


@pytest.mark.slow
def test_nothing_a_trial_started_outlives_its_limit(runtime, model_folder, cache):
    # A fresh cache: the trial is still exporting, converting or loading when its limit comes.
    started = time.monotonic()
    result = CpuBackend().run(_job(runtime, model_folder), timeout_s=4)
    assert result.status is Status.ERROR and "timed out after 4 s" in result.reason
    assert time.monotonic() - started < 60
    left = _marked_processes(cache)
    assert not left, f"processes of the trial still running: {left}"


def _marked_processes(cache: Path) -> list[int]:
    """This user's processes carrying a trial's token (autotune/backends/isolated.py marks every trial's) and this
    module's cache (not another search's trials on the same machine)."""
    ours = f"AUTOTUNE_CACHE={cache}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ours in environ and any(item.startswith(TOKEN_ENV.encode() + b"=") for item in environ):
            found.append(int(entry.name))
    return found
