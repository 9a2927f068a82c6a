"""The llamacpp backend: its configuration, space and gate keys without llama.cpp; with llama-cpp-python installed,
a tiny LLaMA written as GGUF by the test itself runs through llama.cpp's logits, its gate, its continuous batching,
its quantizer, a whole trial through the backend, and a study of llama.cpp's knobs whose recipe verifies and
serves with llama-server."""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from autotune.backends.cpu import CpuBackend
from autotune.backends.llamacpp import LlamaCppBackend
from autotune.backends.sim import SimBackend
from autotune.config.deploy import ENGINE_KNOBS, LLAMACPP_KNOBS, DeployConfig, LlamaCppKnobs
from autotune.errors import SpaceError
from autotune.gate.cache import gate_inputs, gate_key
from autotune.llamacpp.build_info import tools_dir
from autotune.llamacpp.config import SERVER_DEFAULTS, llamacpp_config, server_command
from autotune.space.search_space import default_space, load_space
from tests.conftest import make_tiny_llama


def test_config_validates_and_names_its_server_command():
    with pytest.raises(ValueError, match="flash attention"):
        LlamaCppKnobs(kv_type="q8_0", flash_attn="off")
    with pytest.raises(ValueError, match="n_ubatch"):
        DeployConfig(runtime="llamacpp", n_batch=256, n_ubatch=512)
    with pytest.raises(ValueError, match="page_size does not apply to the llamacpp runtime"):
        DeployConfig.from_dict({"runtime": "llamacpp", "gguf_type": "Q8_0", "page_size": 16})
    config = DeployConfig(runtime="llamacpp", gguf_type="Q8_0", flash_attn="on", kv_type="q8_0", batch_size=16,
                          n_ctx=8192)
    command = server_command(config, "/m/Q8_0.gguf", threads=2, port=9000)
    for part in ("-m /m/Q8_0.gguf", "-t 2", "-np 16", "-c 8192", "-fa on", "-ctk q8_0", "-ctv q8_0", "--kv-unified",
                 "--port 9000"):
        assert part in command
    assert llamacpp_config(config.to_dict()) == config
    assert SERVER_DEFAULTS.batch_size == 4 and SERVER_DEFAULTS.n_ctx == 0  # llama-server's own, given only a model
    with pytest.raises(ValueError, match="engine runtime, not of llama.cpp"):
        server_command(DeployConfig(), "/m/Q8_0.gguf", threads=2)


def test_the_backend_searches_llamacpps_space_and_refuses_the_engines():
    adapted = LlamaCppBackend().space_for(load_space(default_space("llamacpp")))
    assert {d.name for d in adapted.dimensions} == {"batch_size", "device_power", *LLAMACPP_KNOBS}
    with pytest.raises(SpaceError, match="a space of the engine runtime, and backend llamacpp runs llamacpp.*"
                       "search_spaces/llamacpp.yaml"):
        LlamaCppBackend().space_for(load_space())
    configs = [adapted.to_config(p) for p in adapted.grid()]
    assert len(configs) == adapted.grid_size() and all(c.runtime == "llamacpp" for c in configs)
    assert {c.kv_type for c in configs if c.flash_attn == "off"} == {"f16"}  # llama.cpp refuses q8_0 V without FA
    baseline = adapted.to_config(adapted.baseline_params())
    assert baseline == DeployConfig(LlamaCppKnobs(flash_attn="on"), batch_size=8,
                                    device_power=max(adapted.dimension("device_power").values))
    with pytest.raises(ValueError, match="engine runtime"):
        llamacpp_config(DeployConfig())


@pytest.mark.parametrize("backend", [CpuBackend(), SimBackend("a100-80g")], ids=["cpu", "sim"])
def test_the_engines_backends_refuse_llamacpps_space(backend):
    with pytest.raises(SpaceError, match="a space of the llamacpp runtime.*search_spaces/default.yaml"):
        backend.space_for(load_space(default_space("llamacpp")))
    adapted = backend.space_for(load_space())
    assert all(adapted.to_config(p).runtime == "engine" for p in adapted.grid()[:50])


def test_a_configuration_holds_only_its_runtimes_knobs():
    with pytest.raises(ValueError, match="gguf_type does not apply to the engine runtime"):
        DeployConfig(gguf_type="Q8_0")
    with pytest.raises(ValueError, match="quant, fusion_level, layers_per_subgraph do not apply to the llamacpp"):
        DeployConfig(runtime="llamacpp", quant="w8a8", fusion_level="O1", layers_per_subgraph=0)
    with pytest.raises(ValueError, match="flash attention"):
        DeployConfig(runtime="llamacpp", kv_type="q8_0", flash_attn="off")
    engine = DeployConfig(batch_size=16)
    assert not set(engine.to_dict()) & {"runtime", *LLAMACPP_KNOBS}
    # The digest recipes were named by before llama.cpp's knobs existed.
    assert DeployConfig().digest() == "688c8b86cc62"
    llama = DeployConfig(runtime="llamacpp", gguf_type="Q8_0", flash_attn="on", kv_type="q8_0", batch_size=16)
    assert not set(llama.to_dict()) & set(ENGINE_KNOBS) and DeployConfig.from_dict(llama.to_dict()) == llama
    assert llama.label() == "llama.cpp Q8_0/fa=on/kv=q8_0/np=16/b=2048/ub=512/c=4096/t=all"
    # One runtime's knobs are read through the configuration; another's are not there to read.
    assert (llama.gguf_type, llama.knobs) == ("Q8_0", replace(LlamaCppKnobs(), gguf_type="Q8_0", flash_attn="on",
                                                                kv_type="q8_0"))
    with pytest.raises(AttributeError, match="llamacpp runtime has no knob 'quant'"):
        llama.quant  # noqa: B018
    with pytest.raises(AttributeError, match="engine runtime has no knob 'gguf_type'"):
        engine.gguf_type  # noqa: B018
    with pytest.raises(ValueError, match="knobs of the engine runtime given for the llamacpp runtime"):
        DeployConfig(engine.knobs, runtime="llamacpp")


def test_llamacpps_gate_key_follows_its_numerics_and_its_build():
    versions = LlamaCppBackend().gate_versions()
    assert {"llama_cpp_python", "llama_cpp_build"} <= set(versions)

    def key(config: DeployConfig, **changed) -> str:
        return gate_key(gate_inputs("sha256:m", "e", config, tie_epsilon=0.05, min_agreement=0.995, device="llamacpp",
                                    threads=2, versions={**versions, **changed}))

    base = DeployConfig(runtime="llamacpp", gguf_type="F16", flash_attn="on")
    # The numerics: the weights' type, the KV cache's type and the attention kernel; and llama.cpp's build.
    for other in (replace(base, gguf_type="Q8_0"), replace(base, kv_type="q8_0"), replace(base, flash_attn="off"),
                  DeployConfig(batch_size=base.batch_size)):
        assert key(other) != key(base), other
    assert key(base, llama_cpp_build="another") != key(base)
    # Batching and the context only split the same sums differently: the gate's windows are the same.
    for same in (replace(base, batch_size=16), replace(base, n_batch=512, n_ubatch=128), replace(base, n_ctx=8192)):
        assert key(same) == key(base)


def test_a_context_too_small_for_the_batch_is_infeasible_before_anything_is_loaded():
    from autotune.llamacpp.trial import run_llamacpp_trial
    from autotune.trial.job import Job, JobKind, Status

    config = DeployConfig(runtime="llamacpp", batch_size=16, n_ctx=2048)
    job = Job(kind=JobKind.TRIAL, model="no-such-model", config=config.to_dict(),
              workload=dict(num_requests=16, prompt_min=112, prompt_max=144, output_tokens=64))
    result = run_llamacpp_trial(job)  # the model is never looked up
    assert result.status is Status.INFEASIBLE
    assert result.reason == ("n_ctx 2048 cannot hold 16 sequences of up to 208 tokens (the workload's): it needs "
                             "n_ctx >= 3328")


# ---- with llama.cpp ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install "
                               "'autotune[llamacpp]' or scripts/build_llamacpp.sh)")


@pytest.fixture(scope="module")
def shipped_gguf():
    from autotune.llamacpp.gguf_files import source_gguf
    from autotune.models.registry import resolve_model

    return source_gguf(resolve_model("smollm2-135m"))  # only its tokenizer is copied


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(vocab_size=49152)


@pytest.fixture(scope="module")
def gguf_folder(tmp_path_factory, smollm2_folder, shipped_gguf, tiny, llama_cpp):
    """The tiny LLaMA as a folder model (safetensors, SmolLM2's tokenizer) with its F32 GGUF beside them."""
    from tests.llamacpp_factory import write_gguf

    folder = tmp_path_factory.mktemp("tiny-gguf")
    tiny.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, folder / name)
    write_gguf(tiny, folder / "model-f32.gguf", shipped_gguf)
    return folder


def _context(path, **knobs):
    from autotune.llamacpp.engine import LlamaCppModel

    model = LlamaCppModel(path)
    return model, model.context(DeployConfig(runtime="llamacpp", **{"batch_size": 4, "n_ctx": 2048, **knobs}),
                                threads=1)


def test_f32_logits_are_transformers_logits(gguf_folder, tiny):
    model, ctx = _context(gguf_folder / "model-f32.gguf")
    try:
        tokens = list(range(100, 164))
        ours = torch.from_numpy(ctx.all_logits(tokens))
        with torch.inference_mode():
            theirs = tiny(torch.tensor([tokens])).logits[0]
        # The KV cache is f16: the logits differ in the third or fourth digit, so a top-1 may only flip where
        # transformers' own top two are that close.
        assert float((ours - theirs).abs().max()) < 1e-2 * float(theirs.abs().max())
        chosen = theirs.gather(-1, ours.argmax(-1, keepdim=True)).squeeze(-1)
        assert bool((chosen >= theirs.max(-1).values - 0.05).all())
        assert float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()) > 0.9
    finally:
        ctx.close()
        model.close()


def test_continuous_batching_keeps_each_sequence_its_own(gguf_folder):
    from autotune.engine.sequence import Request

    # Two sequences at once (llama.cpp's --parallel is the configuration's batch size).
    model, ctx = _context(gguf_folder / "model-f32.gguf", batch_size=2, n_batch=32, n_ubatch=32)
    try:
        prompts = [list(range(200 + 7 * i, 240 + 5 * i)) for i in range(5)]  # 40..60 tokens: prompts chunked by 32
        together = ctx.run([Request(p, 6, min_new_tokens=6) for p in prompts])
        alone = [ctx.run([Request(p, 6, min_new_tokens=6)])[0] for p in prompts]
        assert [c.output_ids for c in together] == [c.output_ids for c in alone]
        assert all(len(c.token_times) == 6 and c.tpot is not None for c in together)
        forced = ctx.run([Request(prompts[0], 4, min_new_tokens=4, forced_ids=(7, 8, 9, 10))])[0]
        assert forced.output_ids == [7, 8, 9, 10] and forced.greedy_ids[0] == together[0].output_ids[0]
        with pytest.raises(ValueError, match="exactly max_new_tokens"):  # it never stops early: said, not ignored
            ctx.run([Request(prompts[0], 6)])
    finally:
        ctx.close()
        model.close()


def _reference(tiny, folder):
    from autotune.gate.corpus import decode_prompts, eval_windows
    from autotune.gate.reference import compute_reference
    from autotune.models.registry import resolve_model
    from autotune.models.weights import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(str(folder)))
    windows, prompts = eval_windows(tokenizer, 1024), decode_prompts(tokenizer, count=48)
    return compute_reference(tiny, windows, prompts), windows, prompts


def test_gate_passes_a_faithful_gguf_and_fails_a_wrong_one(gguf_folder, tiny, shipped_gguf, tmp_path):
    from autotune.gate.peer import peer_gate
    from tests.llamacpp_factory import write_gguf

    reference, windows, prompts = _reference(tiny, gguf_folder)
    model, ctx = _context(gguf_folder / "model-f32.gguf")
    try:
        good = peer_gate(ctx, reference, windows, prompts)
    finally:
        ctx.close()
        model.close()
    assert good.passed, good.fail_reason()
    assert good.tie_aware_agreement > 0.995 and good.decode_positions >= 48 * 32
    # q and k left in transformers' layout: llama.cpp rotates the wrong pairs of every head.
    model, ctx = _context(write_gguf(tiny, tmp_path / "wrong.gguf", shipped_gguf, permute=False))
    try:
        wrong = peer_gate(ctx, reference, windows, prompts)
    finally:
        ctx.close()
        model.close()
    assert not wrong.passed and wrong.tie_aware_agreement < 0.9


def test_quantized_types_are_made_once_and_cached(gguf_folder, tmp_path, monkeypatch):
    from autotune.llamacpp.gguf_files import gguf_file
    from autotune.models.registry import resolve_model

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    spec = resolve_model(str(gguf_folder))
    assert gguf_file(spec, "sha256:feed", "source") == gguf_folder / "model-f32.gguf"
    q8 = gguf_file(spec, "sha256:feed", "Q8_0", threads=1)
    assert q8.is_file() and q8.stat().st_size < 0.4 * (gguf_folder / "model-f32.gguf").stat().st_size
    made = q8.stat().st_mtime_ns
    assert gguf_file(spec, "sha256:feed", "Q8_0").stat().st_mtime_ns == made


def test_a_trial_through_the_backend(gguf_folder, tmp_path, monkeypatch):
    from autotune.trial.job import Job, JobKind, Status

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    config = DeployConfig(runtime="llamacpp", gguf_type="F16", batch_size=4, device_power=1, n_ctx=2048)
    job = Job(kind=JobKind.TRIAL, model=str(gguf_folder), config=config.to_dict(), repeats=1,
              eval_positions=1024,
              workload=dict(num_requests=6, prompt_min=20, prompt_max=30, output_tokens=8))
    result = LlamaCppBackend().run(job, timeout_s=600)
    assert result.status is Status.OK, (result.reason, result.log_tail)
    assert result.gate["passed"] and result.gate["decode_positions"] > 0
    assert result.bench["throughput_tok_s"] > 0 and result.bench["peak_memory_mb"] > 0
    assert "-np 4" in result.what and result.versions["llama_cpp_python"]


# ---- a study of llama.cpp's knobs, its recipe verified and served ------------------------------------------------

# scripts/build_llamacpp.sh's tools, where this user's cache is (the study below runs on a cache of its own).
_USERS_TOOLS = tools_dir()
_SPACE = """
version: 1
runtime: llamacpp
dimensions:
  batch_size: {values: [2, 4]}
  device_power: {values: [1]}
  gguf_type: {values: [F16]}
  flash_attn: {values: ["on"]}
  kv_type: {values: [f16]}
  n_batch: {values: [64]}
  n_ubatch: {values: [64, 32]}
  n_ctx: {values: [1024]}
baseline: {batch_size: 2, n_ubatch: 64}
speed_baselines:
  as_loaded: {dtype: auto, batch_size: 2}
"""


@pytest.fixture(scope="module")
def llama_study(gguf_folder, tmp_path_factory):
    """Three trials of the llamacpp backend on the tiny GGUF: one numerics (F16, flash attention, f16 KV), batch
    and n_ubatch searched, so that the second and third trials find the first one's teacher-forced gate cached."""
    import os

    import autotune

    tmp = tmp_path_factory.mktemp("llama-study")
    (tmp / "space.yaml").write_text(_SPACE)
    old = os.environ.get("AUTOTUNE_CACHE")
    os.environ["AUTOTUNE_CACHE"] = str(tmp / "cache")
    try:
        result = autotune.search(model=str(gguf_folder), backend="llamacpp", space=tmp / "space.yaml", trials=3,
                                 minutes=0, seed=0, storage=f"sqlite:///{tmp}/s.db", out=tmp / "recipes", requests=4,
                                 prompt_tokens=(20, 30), output_tokens=8, repeats=1, warm_start=False)
        yield result, tmp
    finally:
        if old is None:
            os.environ.pop("AUTOTUNE_CACHE", None)
        else:
            os.environ["AUTOTUNE_CACHE"] = old


def test_a_study_searches_llamacpps_knobs_with_its_gate_cached_by_numerics(llama_study):
    import optuna

    result, _ = llama_study
    trials = optuna.load_study(study_name=result.study, storage=result.storage).trials
    assert result.trials.complete == len(trials) == 3
    configs = [DeployConfig.from_dict(t.user_attrs["config"]) for t in trials]
    assert all(c.runtime == "llamacpp" and c.gguf_type == "F16" for c in configs)
    assert len({(c.batch_size, c.n_ubatch) for c in configs}) == 3  # every trial another point of the space
    assert all(t.user_attrs["label"].startswith("llama.cpp F16/fa=on") for t in trials)
    # The first trial gated from scratch and stored its teacher-forced figures under its numerics; the others
    # found them and ran only their own decode check.
    assert [bool(t.user_attrs["gate_cached"]) for t in trials] == [False, True, True]
    first = trials[0].user_attrs["gate"]
    for t in trials[1:]:
        assert t.user_attrs["gate"]["tie_aware_agreement"] == first["tie_aware_agreement"]
        assert t.user_attrs["gate"]["decode_positions"] > 0 and t.user_attrs["gate"]["passed"]


def test_its_recipe_records_the_llama_server_command_and_verifies(llama_study, capsys):
    import shlex

    from autotune.cli import main
    from autotune.recipes.recipe import load_recipe

    result, _ = llama_study
    path = next(p for p in result.recipes if p.name == "best-throughput.yaml")
    recipe = load_recipe(path)  # schema and checksum
    config = recipe.config
    assert recipe.data["backend"] == "llamacpp" and config.runtime == "llamacpp"
    command = shlex.split(recipe.data["deploy"]["llama_server"])
    assert command[0] == "llama-server" and command[command.index("-m") + 1].endswith("F16.gguf")
    for flag, value in (("-np", config.batch_size), ("-ub", config.n_ubatch), ("-b", 64), ("-c", 1024), ("-t", 1),
                        ("-fa", "on"), ("-ctk", "f16")):
        assert command[command.index(flag) + 1] == str(value), flag
    assert main(["verify", str(path), "--repeats", "1", "--tolerance", "10"]) == 0
    out = capsys.readouterr().out
    assert "gate" in out and "FAIL" not in out and "throughput_tok_s" in out


def test_its_recipe_is_served_by_llama_server(llama_study):
    """`autotune serve` of a llama.cpp recipe becomes llama-server with the recipe's command line, and answers."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from autotune.recipes.recipe import load_recipe
    from autotune.serve.llama_server import llama_server_argv

    result, tmp = llama_study
    path = next(p for p in result.recipes if p.name == "best-throughput.yaml")
    argv = llama_server_argv(load_recipe(path), "127.0.0.1", 9)
    recorded = load_recipe(path).data["deploy"]["llama_server"].split()
    assert argv[argv.index("-m") + 1] == recorded[recorded.index("-m") + 1]
    if not (_USERS_TOOLS / "llama-server").is_file() and shutil.which("llama-server") is None:
        pytest.skip(f"llama-server is not built here (not in {_USERS_TOOLS} nor on PATH): scripts/build_llamacpp.sh")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The study's cache (its GGUF), and the user's llama-server: the study's cache has no tools.
    env = {**os.environ, "AUTOTUNE_CACHE": str(tmp / "cache"), "PATH": f"{_USERS_TOOLS}:{os.environ['PATH']}"}
    server = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", str(path), "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    pytest.fail(f"llama-server did not come up: {server.stdout.read()[-2000:]}")
                time.sleep(0.5)
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = json.loads(r.read())
        assert answer["usage"]["completion_tokens"] == 4 and answer["choices"][0]["text"]
    finally:
        server.terminate()
        server.wait(timeout=30)
