"""The openvino backend: its configuration, space, gate keys and refusals without OpenVINO; with openvino-genai
installed, a tiny LLaMA exported by the test itself (optimum-intel in the export environment autotune makes) runs
through OpenVINO's logits, its continuous batching and teacher forcing, its gate, and a whole trial through the
backend."""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotune.backends.cpu import CpuBackend
from autotune.backends.openvino import OpenVinoBackend
from autotune.backends.sim import SimBackend
from autotune.config.deploy import DeployConfig, OpenVinoKnobs
from autotune.config.runtimes import ENGINE_KNOBS, OPENVINO_KNOBS, RUNTIMES
from autotune.errors import SpaceError
from autotune.gate.cache import gate_inputs, gate_key
from autotune.openvino.config import PIPELINE_DEFAULTS, openvino_config
from autotune.space.search_space import default_space, load_space
from tests.conftest import make_tiny_llama


def test_knobs_validate_label_and_round_trip():
    with pytest.raises(ValueError, match="f32 KV cache needs inference_precision f32"):
        OpenVinoKnobs(kv_precision="f32")
    with pytest.raises(ValueError, match="apply to weight_format int4 only"):
        OpenVinoKnobs(weight_format="int8", group_size=64)
    with pytest.raises(ValueError, match="weight_format must be one of"):
        OpenVinoKnobs(weight_format="int3")
    with pytest.raises(ValueError, match="ratio must be in"):
        OpenVinoKnobs(weight_format="int4", ratio=0)
    with pytest.raises(ValueError, match="page_size does not apply to the openvino runtime"):
        DeployConfig.from_dict({"runtime": "openvino", "page_size": 16})
    config = DeployConfig(runtime="openvino", weight_format="int4", int4_method="awq", group_size=64, ratio=0.8,
                          batch_size=16, device_power=2)
    assert config.label() == ("OpenVINO int4+awq/g64/r0.8@bf16+kv:u8/seqs=16/tokens=256/cache=autoGB/split_fuse=on"
                              "/prefix=off/t=2")
    assert not set(config.to_dict()) & set(ENGINE_KNOBS)
    assert DeployConfig.from_dict(config.to_dict()) == config and openvino_config(config.to_dict()) == config
    # The digest names recipe files: it stays what it was when the runtime came.
    assert PIPELINE_DEFAULTS.digest() == DeployConfig.from_dict(PIPELINE_DEFAULTS.to_dict()).digest() == "170f939b4f82"
    assert config.knobs.reads_calibration() and not replace(config.knobs, int4_method="data_free").reads_calibration()
    assert config.knobs.cost_knobs() == {"quant": "w4a16", "dtype": "bf16", "page_size": 32}
    with pytest.raises(ValueError, match="engine runtime, not of OpenVINO"):
        openvino_config(DeployConfig())
    with pytest.raises(AttributeError, match="openvino runtime has no knob 'quant'"):
        config.quant  # noqa: B018


@pytest.mark.slow  # the CPU's capability probe, once per machine
def test_the_backend_searches_openvinos_space_and_the_engines_refuse_it():
    adapted = OpenVinoBackend().space_for(load_space(default_space("openvino")))
    assert {d.name for d in adapted.dimensions} == {"batch_size", "device_power", *OPENVINO_KNOBS}
    configs = [adapted.to_config(p) for p in adapted.grid()]
    assert len(configs) == adapted.grid_size() and all(c.runtime == "openvino" for c in configs)
    # OpenVINO refuses an f32 KV cache under bf16 inference: the space never asks for one.
    assert {c.kv_precision for c in configs if c.inference_precision == "bf16"} <= {"u8", "bf16", "u4"}
    baseline = adapted.to_config(adapted.baseline_params())
    assert baseline.knobs == replace(OpenVinoKnobs(), inference_precision=adapted.dimension(
        "inference_precision").values[0]) and baseline.batch_size == 16
    with pytest.raises(SpaceError, match="a space of the engine runtime, and backend openvino runs openvino"):
        OpenVinoBackend().space_for(load_space())
    for backend in (CpuBackend(), SimBackend("a100-80g")):
        with pytest.raises(SpaceError, match="a space of the openvino runtime.*search_spaces/default.yaml"):
            backend.space_for(load_space(default_space("openvino")))


def test_a_space_asking_for_an_f32_kv_cache_under_bf16_is_refused_at_load(tmp_path):
    path = tmp_path / "ov.yaml"
    path.write_text("version: 1\nruntime: openvino\ndimensions:\n  inference_precision: {values: [bf16, f32]}\n"
                    "  kv_precision:\n    by: inference_precision\n    values: {bf16: [u8, f32]}\n")
    with pytest.raises(SpaceError, match=r"kv_precision: 'f32' is not a valid value for inference_precision=bf16"):
        load_space(path)


def test_openvinos_gate_key_follows_its_numerics_and_its_versions():
    versions = OpenVinoBackend().gate_versions()
    assert {"openvino_genai", "export"} <= set(versions)

    def key(config: DeployConfig, **changed) -> str:
        return gate_key(gate_inputs("sha256:m", "e", config, tie_epsilon=0.05, min_agreement=0.995, device="openvino",
                                    threads=2, versions={**versions, **changed}))

    base = DeployConfig(runtime="openvino", batch_size=8)
    for other in (replace(base, knobs=replace(base.knobs, weight_format="int8")),
                  replace(base, knobs=replace(base.knobs, kv_precision="bf16")),
                  replace(base, knobs=replace(base.knobs, inference_precision="f32")),
                  DeployConfig(batch_size=8)):
        assert key(other) != key(base), other
    assert key(base, openvino_genai="another") != key(base)
    # The scheduler only splits the same work differently: the gate's windows are the same.
    for same in (replace(base, batch_size=16), replace(base, knobs=replace(base.knobs, max_num_batched_tokens=2048)),
                 replace(base, knobs=replace(base.knobs, cache_size=2, prefix_caching=True))):
        assert key(same) == key(base)


def test_the_registry_names_how_each_runtime_runs_and_is_served():
    assert {name: (r.trial_entry, r.served_by) for name, r in RUNTIMES.items()} == {
        "engine": ("autotune.trial", "autotune"), "llamacpp": ("autotune.llamacpp.trial", "llama-server"),
        "openvino": ("autotune.openvino.trial", "autotune")}


# ---- with OpenVINO -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def genai():
    return pytest.importorskip("openvino_genai", reason="openvino-genai is not installed (bash scripts/setup.sh)")


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(vocab_size=49152)


@pytest.fixture(scope="module")
def ov_cache(tmp_path_factory, genai):
    """A cache of this module's own, sharing the user's export environment (made once, a minute of pip) by a link:
    every IR is exported anew here."""
    from autotune.openvino.export_env import export_python

    shared = export_python().parent.parent
    cache = tmp_path_factory.mktemp("ov-cache")
    (cache / "openvino").mkdir()
    (cache / "openvino" / shared.name).symlink_to(shared)
    old = os.environ.get("AUTOTUNE_CACHE")
    os.environ["AUTOTUNE_CACHE"] = str(cache)
    yield cache
    if old is None:
        del os.environ["AUTOTUNE_CACHE"]
    else:
        os.environ["AUTOTUNE_CACHE"] = old


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, smollm2_folder, tiny):
    folder = tmp_path_factory.mktemp("tiny-ov")
    tiny.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def fp32_ir(tiny_folder, ov_cache) -> Path:
    from autotune.models.registry import resolve_model
    from autotune.openvino.ir_files import ir_folder

    return ir_folder(resolve_model(str(tiny_folder)), "sha256:feed", OpenVinoKnobs(weight_format="fp32"))


def _pipeline(folder: Path, **knobs):
    from autotune.openvino.pipeline import OpenVinoPipeline

    return OpenVinoPipeline(folder, DeployConfig(runtime="openvino", **{
        "batch_size": 4, "inference_precision": "f32", "kv_precision": "f32", **knobs}), threads=1)


@pytest.mark.slow
def test_f32_logits_are_transformers_logits(fp32_ir, tiny):
    tokens = list(range(100, 164))
    ours = torch.from_numpy(_pipeline(fp32_ir).all_logits(tokens))
    with torch.inference_mode():
        theirs = tiny(torch.tensor([tokens])).logits[0]
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=2e-3, rtol=1e-3), (ours - theirs).abs().max()


@pytest.mark.slow
def test_continuous_batching_keeps_each_sequence_its_own_and_forcing_decides_on_the_forced_prefix(fp32_ir):
    from autotune.engine.sequence import Request

    pipe = _pipeline(fp32_ir)
    prompts = [list(range(200 + 7 * i, 230 + 11 * i)) for i in range(4)]
    together = pipe.run([Request(p, 12, min_new_tokens=12) for p in prompts])
    alone = [pipe.run([Request(p, 12, min_new_tokens=12)])[0] for p in prompts]
    assert [c.output_ids for c in together] == [c.output_ids for c in alone]
    assert all(len(c.token_times) == 12 and c.ttft > 0 for c in together)
    # Forced on another prompt's continuation, the choices differ somewhere: each is the one the model makes on the
    # forced prefix, as its logits over prompt + forced tokens say.
    forced = [tuple(together[(i + 1) % 4].output_ids) for i in range(4)]
    runs = pipe.run([Request(p, 12, min_new_tokens=12, forced_ids=f) for p, f in zip(prompts, forced)])
    assert any(r.greedy_ids != list(f) for r, f in zip(runs, forced))
    for p, f, r in zip(prompts, forced, runs):
        assert r.output_ids == list(f) and len(r.greedy_ids) == 12
        for j in (0, 5, 11):
            assert r.greedy_ids[j] == int(pipe.all_logits(p + list(f[:j]))[-1].argmax())


@pytest.mark.slow
def test_gate_passes_a_faithful_ir_and_fails_another_models(fp32_ir, tiny, tiny_folder):
    from autotune.gate.corpus import decode_prompts, eval_windows
    from autotune.gate.peer import peer_gate
    from autotune.gate.reference import compute_reference
    from autotune.models.registry import resolve_model
    from autotune.models.weights import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(str(tiny_folder)))
    windows, prompts = eval_windows(tokenizer, 1024), decode_prompts(tokenizer, count=48)
    good = peer_gate(_pipeline(fp32_ir), compute_reference(tiny, windows, prompts), windows, prompts)
    assert good.passed, good.fail_reason()
    assert good.tie_aware_agreement > 0.995 and good.decode_positions >= 48 * 32
    # The same IR judged against another model's reference: a build that computes the wrong function.
    other = compute_reference(make_tiny_llama(vocab_size=49152, seed=1), windows, prompts)
    wrong = peer_gate(_pipeline(fp32_ir), other, windows, prompts)
    assert not wrong.passed and wrong.tie_aware_agreement < 0.9


@pytest.mark.slow
def test_a_trial_through_the_backend_gated_and_benchmarked_alike(tiny_folder, ov_cache):
    from autotune.trial.job import Job, JobKind, Status

    config = DeployConfig(runtime="openvino", weight_format="fp32", inference_precision="f32", kv_precision="f32",
                          batch_size=4, device_power=1)
    job = Job(kind=JobKind.TRIAL, model=str(tiny_folder), config=config.to_dict(), repeats=1, eval_positions=1024,
              workload=dict(num_requests=6, prompt_min=20, prompt_max=30, output_tokens=8))
    result = OpenVinoBackend().run(job, timeout_s=900)
    assert result.status is Status.OK, (result.reason, result.log_tail)
    assert result.gate["passed"] and result.gate["decode_positions"] > 0
    # The engine's benchmark figures, by the same names.
    assert {"throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "peak_memory_mb",
            "repeats"} <= set(result.bench)
    assert result.bench["throughput_tok_s"] > 0 and result.bench["peak_memory_mb"] > 0
    assert result.versions["openvino_genai"] and "optimum-intel==" in result.versions["export_env"]
    base = Path(result.build["ir"])
    assert base.name == "fp32" and (base / "openvino_model.xml").is_file()
    made = (base / "openvino_model.bin").stat().st_mtime_ns
    # fp16 weights computing in bf16: the peaked tiny model's outputs do not survive it, so the trial is gated and
    # never benchmarked; its IR is derived from the fp32 export made above, not exported again.
    half = DeployConfig(runtime="openvino", weight_format="fp16", batch_size=2, device_power=1)
    gated = OpenVinoBackend().run(Job(**{**job.to_dict(), "config": half.to_dict()}), timeout_s=900)
    assert gated.status is Status.GATED and gated.bench is None and not gated.gate["passed"]
    assert Path(gated.build["ir"]).name == "fp16" and (base / "openvino_model.bin").stat().st_mtime_ns == made
    # A model that is not there: an ERROR with its reason, not a crash.
    broken = OpenVinoBackend().run(Job(**{**job.to_dict(), "model": str(ov_cache / "no-such-folder")}), timeout_s=300)
    assert broken.status is Status.ERROR and broken.reason


# ---- one study over two runtimes: the engine and OpenVINO on one front --------------------------------------------

_ENGINE_SPACE = """
version: 1
dimensions:
  dtype: {values: [fp32]}
  quant: {values: [none]}
  fusion_level: {values: [O0]}
  batch_size: {values: [2, 4]}
  page_size: {values: [16]}
  kv_policy: {values: [on_demand]}
  device_power: {values: [1]}
baseline: {batch_size: 2}
speed_baselines:
  as_loaded: {dtype: fp32, batch_size: 2}
"""
_OPENVINO_SPACE = """
version: 1
runtime: openvino
dimensions:
  batch_size: {values: [2, 4]}
  device_power: {values: [1]}
  weight_format: {values: [fp32]}
  inference_precision: {values: [f32]}
  kv_precision:
    by: inference_precision
    values: {f32: [f32]}
baseline: {batch_size: 4}
"""


@pytest.fixture(scope="module")
def mixed_study(tiny_folder, ov_cache, tmp_path_factory):
    """Three trials of one study on the cpu backend over two runtimes: the engine's and OpenVINO's plain
    deployments (their baselines, the first two trials), then one more of either."""
    import autotune

    tmp = tmp_path_factory.mktemp("mixed-study")
    (tmp / "engine.yaml").write_text(_ENGINE_SPACE)
    (tmp / "openvino.yaml").write_text(_OPENVINO_SPACE)
    kwargs = dict(model=str(tiny_folder), backend="cpu", space=[tmp / "engine.yaml", tmp / "openvino.yaml"],
                  minutes=0, seed=0, storage=f"sqlite:///{tmp}/s.db", study="mixed", out=tmp / "recipes",
                  requests=4, prompt_tokens=(20, 30), output_tokens=8, repeats=1, warm_start=False)
    first = autotune.search(trials=3, **kwargs)
    return first, kwargs


@pytest.mark.slow
def test_one_study_measures_two_runtimes_on_one_front(mixed_study):
    import optuna

    from autotune.results.front import pareto_trials

    result, _ = mixed_study
    study = optuna.load_study(study_name=result.study, storage=result.storage)
    trials = study.trials
    runtimes = [DeployConfig.from_dict(t.user_attrs["config"]).runtime for t in trials]
    # Each runtime's plain deployment first, in the registry's order; each gated on its own numbers.
    assert runtimes[:2] == ["engine", "openvino"] and len(trials) == 3
    assert [t.user_attrs.get("role") for t in trials[:2]] == ["baseline", "baseline"]
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["gate"]["passed"] for t in trials)
    assert trials[0].params["batch_size[engine]"] == 2 and trials[1].params["batch_size[openvino]"] == 4
    # The two runtimes' figures are of one workload, read on one front and in one table.
    fronts = {DeployConfig.from_dict(t.user_attrs["config"]).runtime for t in pareto_trials(study)}
    assert fronts and fronts <= {"engine", "openvino"}
    assert "OpenVINO fp32@f32+kv:f32" in result.table and "fp32/O0/bs=" in result.table
    written = [p for p in result.recipes if p.suffix == ".yaml"]
    assert written and all(p.parent.name.startswith("cpu-") for p in written)


@pytest.mark.slow
def test_the_mixed_study_resumes_without_repeating_its_baselines(mixed_study):
    import optuna

    import autotune

    first, kwargs = mixed_study
    # Its own recipe folder: the export of a changed front removes recipes that left it, which the served test reads.
    again = autotune.search(trials=1, **{**kwargs, "out": Path(kwargs["out"]).parent / "recipes-resumed"})
    trials = optuna.load_study(study_name=again.study, storage=again.storage).trials
    assert len(trials) == 4 and [t.user_attrs.get("role") for t in trials].count("baseline") == 2
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4  # no configuration measured twice


@pytest.mark.slow
def test_an_openvino_recipe_is_verified_and_served_behind_autotunes_server(mixed_study, capsys):
    """Its recipe says how it ran; `autotune verify` re-gates it; `autotune serve` runs the pipeline behind the
    guard and the OpenAI API: a completion, a refused request without the key, the gauges of OpenVINO's cache."""
    import json

    from autotune.cli import main
    from autotune.recipes.recipe import load_recipe
    from autotune.serve.guard import Access
    from tests.recipe_factory import Served

    result, _ = mixed_study
    paths = [p for p in result.recipes if load_recipe(p).config.runtime == "openvino"]
    assert paths, "the front holds no OpenVINO point"
    recipe = load_recipe(paths[0])
    assert recipe.data["deploy"]["pipeline"].startswith("ContinuousBatchingPipeline(")
    assert recipe.data["deploy"]["command"] == f"autotune serve {paths[0]}"
    assert main(["verify", str(paths[0]), "--repeats", "1", "--tolerance", "1000"]) == 0
    assert "FAIL" not in capsys.readouterr().out
    served = Served(paths[0], access=Access(api_key="test-key-123"))
    try:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
        body = json.dumps({"model": "m", "prompt": "The licence", "max_tokens": 6, "min_tokens": 6})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json",
                                                      "Authorization": "Bearer test-key-123"})
        answer = conn.getresponse()
        data = json.loads(answer.read())
        assert answer.status == 200, data
        assert data["usage"]["completion_tokens"] == 6 and data["choices"][0]["text"]
        conn.close()
        status, _ = served.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
        assert status == 401  # the guard: no key, no answer
        health = served.get("/health")
        assert health[0] == 200 and json.loads(health[1])["configuration"]["runtime"] == "openvino"
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer test-key-123"})
        metrics = conn.getresponse().read().decode()
        conn.close()
        total = next(float(line.split()[-1]) for line in metrics.splitlines() if "kv_pages_total" in line
                     and not line.startswith("#"))
        assert total > 0  # OpenVINO's KV blocks, from its pipeline's cache size
    finally:
        served.close()


def test_runtimes_are_named_and_checked_before_anything_runs():
    import autotune
    from autotune.errors import UserInputError

    with pytest.raises(UserInputError, match="runtimes must be None .* or names among engine, llamacpp, openvino"):
        autotune.search(runtimes=["engine", "tensorrt"])
    with pytest.raises(UserInputError, match="give runtimes or a space file, not both"):
        autotune.search(runtimes=["engine"], space="search_spaces/default.yaml")


@pytest.mark.slow  # the CPU's capability probe, once per machine
def test_the_cpu_backend_spans_the_runtimes_it_can_run_and_refuses_one_it_cannot(capsys):
    from autotune.errors import BackendUnavailable

    backend = CpuBackend()
    here = backend.runtimes_here()
    assert here["engine"] is None
    space = backend.space_over(None)
    said = capsys.readouterr()
    assert space.runtimes == tuple(r for r, why in here.items() if why is None)
    assert space.dimensions[0].name == "runtime" and space.dimension("batch_size").by == "runtime"
    assert [space.to_config(b).runtime for b in space.baselines()] == list(space.runtimes)
    for name, why in here.items():
        if why:
            assert f"runtime {name}: not searched here ({why})" in said.err + said.out
            with pytest.raises(BackendUnavailable, match=f"runtime {name} cannot run here"):
                backend.space_over((name,))
    assert backend.space_over(("engine",)).runtimes == ("engine",)  # one runtime: its own space, as before
