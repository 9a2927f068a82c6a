"""The llamacpp backend: its configuration and space without llama.cpp; with llama-cpp-python installed, a tiny
LLaMA written as GGUF by the test itself runs through llama.cpp's logits, its gate, its continuous batching, its
quantizer and a whole trial through the backend."""
from __future__ import annotations

import shutil

import pytest
import torch

from autotune.backends.llamacpp import LLAMACPP_FIXED, LlamaCppBackend, llamacpp_config
from autotune.config.deploy import DeployConfig
from autotune.llamacpp.config import SERVER_DEFAULTS, LlamaCppConfig
from autotune.space.search_space import load_space
from tests.conftest import make_tiny_llama


def test_config_validates_and_names_its_server_command():
    with pytest.raises(ValueError, match="flash attention"):
        LlamaCppConfig(kv_type="q8_0", flash_attn="off")
    with pytest.raises(ValueError, match="n_ubatch"):
        LlamaCppConfig(n_batch=256, n_ubatch=512)
    with pytest.raises(ValueError, match="unknown"):
        LlamaCppConfig.from_dict({"gguf_type": "Q8_0", "page_size": 16})
    config = LlamaCppConfig(gguf_type="Q8_0", flash_attn="on", kv_type="q8_0", parallel=16, n_ctx=8192)
    command = config.server_command("/m/Q8_0.gguf", threads=2, port=9000)
    for part in ("-m /m/Q8_0.gguf", "-t 2", "-np 16", "-c 8192", "-fa on", "-ctk q8_0", "-ctv q8_0", "--kv-unified",
                 "--port 9000"):
        assert part in command
    assert LlamaCppConfig.from_dict(config.to_dict()) == config
    assert SERVER_DEFAULTS.parallel == 4 and SERVER_DEFAULTS.n_ctx == 0  # llama-server's own, given only a model


def test_space_keeps_parallel_and_threads_and_drops_the_rest_with_reasons():
    space = load_space()
    adapted = LlamaCppBackend().adapt_space(space)
    kept = {d.name for d in adapted.dimensions}
    assert "batch_size" in kept and "device_power" in kept
    for name in ("dtype", "quant", "fusion_level", "page_size", "kv_policy"):
        assert name not in kept and "llama.cpp" in adapted.dropped[name]
    assert "fixed in this study" in adapted.dropped["llamacpp"]
    config = llamacpp_config(DeployConfig(batch_size=16, device_power=2).to_dict())
    assert (config.parallel, config.threads, config.gguf_type) == (16, 2, LLAMACPP_FIXED.gguf_type)
    assert llamacpp_config(config.to_dict()) == config


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
    return model, model.context(LlamaCppConfig(**{"n_ctx": 2048, "parallel": 4, **knobs}), threads=1)


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
    from autotune.llamacpp.engine import Request

    model, ctx = _context(gguf_folder / "model-f32.gguf", parallel=2, n_batch=32, n_ubatch=32)
    try:
        prompts = [list(range(200 + 7 * i, 240 + 5 * i)) for i in range(5)]  # 40..60 tokens: prompts chunked by 32
        together = ctx.run([Request(p, 6) for p in prompts])
        alone = [ctx.run([Request(p, 6)])[0] for p in prompts]
        assert [c.output_ids for c in together] == [c.output_ids for c in alone]
        assert all(len(c.token_times) == 6 and c.tpot is not None for c in together)
        forced = ctx.run([Request(prompts[0], 4, forced=(7, 8, 9, 10))])[0]
        assert forced.output_ids == [7, 8, 9, 10] and forced.greedy_ids[0] == together[0].output_ids[0]
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
    from autotune.llamacpp.gate import llamacpp_gate
    from tests.llamacpp_factory import write_gguf

    reference, windows, prompts = _reference(tiny, gguf_folder)
    model, ctx = _context(gguf_folder / "model-f32.gguf")
    try:
        good = llamacpp_gate(ctx, reference, windows, prompts)
    finally:
        ctx.close()
        model.close()
    assert good.passed, good.fail_reason()
    assert good.tie_aware_agreement > 0.995 and good.decode_positions >= 48 * 32
    # q and k left in transformers' layout: llama.cpp rotates the wrong pairs of every head.
    model, ctx = _context(write_gguf(tiny, tmp_path / "wrong.gguf", shipped_gguf, permute=False))
    try:
        wrong = llamacpp_gate(ctx, reference, windows, prompts)
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
    config = LlamaCppConfig(gguf_type="F16", parallel=4, threads=1, n_ctx=2048)
    job = Job(kind=JobKind.TRIAL, model=str(gguf_folder), config=config.to_dict(), repeats=1, eval_positions=1024,
              workload=dict(num_requests=6, prompt_min=20, prompt_max=30, output_tokens=8))
    result = LlamaCppBackend().run(job, timeout_s=600)
    assert result.status is Status.OK, (result.reason, result.log_tail)
    assert result.gate["passed"] and result.gate["decode_positions"] > 0
    assert result.bench["throughput_tok_s"] > 0 and result.bench["peak_memory_mb"] > 0
    assert "-np 4" in result.what and result.versions["llama_cpp_python"]
