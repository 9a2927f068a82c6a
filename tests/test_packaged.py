"""O2 on the CPU from AOTInductor packages (autotune/engine/packaged.py): a first build compiles and saves each graph,
a second build from the same folder loads them all, compiles nothing and gives the same greedy tokens, and those are
torch.compile's at O2 too. A corrupt package is compiled again with the reason in the log; a folder made under
another key is emptied (autotune/engine/startup_cache.py)."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_llama

from autotune.config.deploy import DeployConfig
from autotune.engine import Request, build_engine
from autotune.engine.packaged import digests_path
from autotune.engine.startup_cache import META, PACKAGES, StartupCache

# One segment, a batch of 1: three graphs (the prefill of one prompt, the decode of one row, the head), each an
# AOTInductor compile of about 10 s on two cores.
CONFIG = DeployConfig(fusion_level="O2", layers_per_subgraph=0, batch_size=1, page_size=16)


def _greedy(packages) -> tuple[list[int], object]:
    torch._dynamo.reset()
    engine = build_engine(make_tiny_llama(num_hidden_layers=1), CONFIG, packages=packages)
    completion, = engine.runner(max_seq_len=64).run([Request([5, 6, 7], 6, min_new_tokens=6)])
    return completion.output_ids, engine.packaged


@pytest.fixture(scope="module")
def first_build(tmp_path_factory):
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("no oneDNN bf16 here: freezing may not prepack")
    folder = tmp_path_factory.mktemp("packages")
    tokens, packaged = _greedy(folder)
    return folder, tokens, packaged


@pytest.mark.slow
def test_a_second_build_loads_every_graph_with_the_same_tokens(first_build):
    folder, tokens, first = first_build
    assert first.num_compiled == 3 and first.num_loaded == 0 and len(tokens) == 6
    again, second = _greedy(folder)
    assert second.num_compiled == 0 and second.num_loaded == 3
    assert again == tokens


@pytest.mark.slow
def test_packages_compute_what_torch_compile_computes_at_o2(first_build):
    _, tokens, _ = first_build
    compiled, packaged = _greedy(None)
    assert packaged is None and compiled == tokens


@pytest.mark.slow
def test_one_decode_package_takes_every_width_a_serving_step_has(first_build):
    """A serving runner's decode steps are as wide as their rows' pages (2, 3 and 4 of 16 tokens here): the decode
    package exported at the offline runner's width of 4 takes all of them, with the same tokens."""
    folder, tokens, _ = first_build
    torch._dynamo.reset()
    engine = build_engine(make_tiny_llama(num_hidden_layers=1), CONFIG, packages=folder)
    widths: list[int] = []
    original = engine.model.decode
    engine.model.decode = lambda *args, **kwargs: widths.append(args[3].shape[1]) or original(*args, **kwargs)
    runner = engine.runner(max_seq_len=64, bucketed=True)
    served = [runner.run([Request(prompt, 6, min_new_tokens=6)])[0].output_ids
              for prompt in ([5, 6, 7], [5] * 40, [6] * 45)]
    assert sorted(set(widths)) == [2, 3, 4]
    assert engine.packaged.num_compiled == 0 and served[0] == tokens


@pytest.mark.slow
def test_one_decode_package_serves_every_batch_bucket(tmp_path):
    """A serving runner of batch 4 decodes in buckets of 2 and 4 rows, a lone row padded to 2: one decode package
    for all of them, where dynamo keeps a graph per bucket (1, 2 and 4), with torch.compile's tokens at each."""
    config = DeployConfig(fusion_level="O2", layers_per_subgraph=0, batch_size=4, page_size=16)
    prompts = ([5, 6, 7], [8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18])

    def served(packages) -> tuple[list[list[int]], object]:
        torch._dynamo.reset()
        engine = build_engine(make_tiny_llama(num_hidden_layers=1), config, packages=packages)
        runner = engine.runner(max_seq_len=64, bucketed=True)
        runs = [runner.run([Request(p, 6, min_new_tokens=6) for p in prompts[:rows]]) for rows in (1, 2, 4)]
        return [c.output_ids for run in runs for c in run], engine.packaged

    tokens, packaged = served(tmp_path)
    decodes = {stem for stem in packaged.ran if json.loads((tmp_path / f"{stem}.json").read_text())["kind"]
               == "decode"}
    assert len(decodes) == 1
    assert served(None)[0] == tokens

@pytest.mark.slow
def test_a_corrupt_package_is_compiled_again_with_the_reason(first_build, tmp_path, capsys):
    folder, tokens, _ = first_build
    copy = tmp_path / "packages"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    digests_path(copy).write_bytes(digests_path(folder).read_bytes())  # the record beside the folder, with it
    broken = next(copy.glob("head-*.pt2"))
    broken.write_bytes(broken.read_bytes()[:-10])
    again, packaged = _greedy(copy)
    assert packaged.num_compiled == 1 and packaged.num_loaded == 2 and again == tokens
    assert f"O2 package {broken.name} not used" in capsys.readouterr().err


def test_a_package_folder_made_under_another_key_is_emptied(tmp_path, capsys):
    cache = StartupCache(tmp_path / "startup", {"recipe": "sha256:test", "torch": torch.__version__},
                         enabled=False, packaged=True)
    assert cache.packages() == tmp_path / "startup" / PACKAGES
    assert "O2 packages not used: none yet" in capsys.readouterr().err
    stale = tmp_path / "startup" / PACKAGES / "segment0-x.pt2"
    stale.write_bytes(b"old")
    assert cache.packages() is not None and stale.exists()  # same key: kept
    assert "O2 packages from" in capsys.readouterr().err
    other = StartupCache(cache.folder, {**cache.key, "torch": "2.0.0"}, enabled=False, packaged=True)
    assert other.packages() is not None and not stale.exists()
    err = capsys.readouterr().err
    assert f"made under another key (torch {torch.__version__!r} there, '2.0.0' here); it is emptied" in err, err
    assert json.loads((cache.folder / PACKAGES / META).read_text())["key"] == other.key


def test_only_o2_on_the_cpu_is_packaged(tmp_path):
    assert StartupCache(tmp_path, {}, packaged=False).packages() is None


def test_a_packaged_engines_serving_runner_pads_a_lone_row_and_warms_a_lone_prompt(monkeypatch):
    engine = build_engine(make_tiny_llama(num_hidden_layers=1), DeployConfig(batch_size=4, page_size=16))
    assert engine.runner(max_seq_len=64, bucketed=True).buckets == (1, 2, 4)  # eager: no packages
    monkeypatch.setattr(engine, "packaged", object())
    runner = engine.runner(max_seq_len=64, bucketed=True)
    assert runner.buckets == (2, 4) and engine.runner(max_seq_len=64).buckets == (4,)
    runner.pad_batch = True  # as a compiled engine's (this one is eager: warm-up is all that is looked at here)
    batches: list[int] = []
    monkeypatch.setattr(runner, "run", lambda requests: batches.append(len(requests)) or [])
    runner.warm_up()
    assert batches == [1, 2, 4]  # a lone prompt's prefill first, then each bucket
