"""The first start of a packaged (O2, CPU) build checks the program it is about to serve against its recipe: the
decode check, run through every graph the server's warm-up runs, and one timed run on the serving runner's graphs,
kept with the packages and read again by later starts; a decode check that fails, or one that missed a served
graph, refuses the start unless forced, and figures beyond the recipe's spread are said with both figures."""
from __future__ import annotations

import copy
import json

import pytest
from recipe_factory import tiny_recipe

from autotune.devices.cpu import CpuDevice
from autotune.errors import UserInputError
from autotune.gate.design import design
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer
from autotune.paths import private_dir
from autotune.recipes.recipe import Recipe, load_recipe
from autotune.serve import first_start
from autotune.serve.engine_loop import EngineLoop
from autotune.serve.first_start import CHECK, check_packaged, differences, served_graphs

MAX_SEQ_LEN = 512  # the server's (the recipe's deploy.max_seq_len)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_folder):
    """A packaged O2 build of the peaked tiny model (fp32: AOTInductor's bf16 needs oneDNN's bf16) and its recipe."""
    tmp = tmp_path_factory.mktemp("first-start")
    path = tiny_recipe(tmp, tiny_model_folder, fusion_level="O2", layers_per_subgraph=0, batch_size=2,
                       page_size=16, dtype="fp32")
    recipe = load_recipe(path)
    spec = resolve_model(recipe.model)
    engine = CpuDevice().build(load_hf_model(spec, "float32"), recipe.config,
                               packages=private_dir(tmp / "startup" / "o2"))
    return engine, recipe, load_tokenizer(spec)


@pytest.mark.slow
def test_the_first_start_measures_the_packaged_program_and_later_ones_read_it(served, capsys, monkeypatch):
    engine, recipe, tokenizer = served
    folder = engine.packaged.folder
    check = check_packaged(engine, recipe, tokenizer, folder, base_rss=0, force=False, max_seq_len=MAX_SEQ_LEN)
    err = capsys.readouterr().err
    assert "first start of these packages" in err and "packaged program: decode 1.0000" in err, err
    assert check["decode_passed"] and check["decode_agreement"] == 1.0 and check["decode_positions"] >= 1536
    assert check["throughput_tok_s"] > 0 and check["peak_memory_mb"] > 0
    assert json.loads((folder / CHECK).read_text()) == check
    # The decode check ran every graph the server's warm-up runs: the prefill of one prompt and of several, the
    # prompt chunk, the decode (one package for every batch; a lone row is padded to 2), the head of one row and of
    # several.
    served = served_graphs(engine, MAX_SEQ_LEN)
    assert "unchecked" not in check and served <= set(check["graphs"]) and len(served) >= 6
    assert engine.packaged.checked == set(check["graphs"]) and engine.packaged.num_compiled >= len(served)
    assert "WARNING" not in capsys.readouterr().err

    def never(*args):
        raise AssertionError("a later start measures nothing")

    monkeypatch.setattr(first_start, "measure_packaged", never)
    assert check_packaged(engine, recipe, tokenizer, folder, base_rss=0, force=False, max_seq_len=MAX_SEQ_LEN) == check
    assert "checked at their first start" in capsys.readouterr().err


@pytest.mark.slow
def test_a_served_graph_the_check_did_not_run_refuses_the_start_and_a_later_start_checks_it(served, tmp_path,
                                                                                            capsys, monkeypatch):
    engine, recipe, tokenizer = served
    graphs = sorted(served_graphs(engine, MAX_SEQ_LEN))
    passed = {"decode_agreement": 1.0, "decode_positions": 1536, "decode_passed": True, "decode_decided": True,
              "decode_verdict": "pass", "throughput_tok_s": 1.0, "peak_memory_mb": 1.0}
    # A check that ran all but the first of them: the start is refused, naming it.
    monkeypatch.setattr(first_start, "measure_packaged", lambda *args: {**passed, "graphs": graphs[1:]})
    with pytest.raises(UserInputError, match=f"did not run 1 of the graphs the server runs \\({graphs[0]}\\)"):
        check_packaged(engine, recipe, tokenizer, tmp_path, base_rss=0, force=False, max_seq_len=MAX_SEQ_LEN)
    # A later start finds that check short of a served graph: it checks again, now all of them.
    monkeypatch.setattr(first_start, "measure_packaged", lambda *args: {**passed, "graphs": graphs})
    check = check_packaged(engine, recipe, tokenizer, tmp_path, base_rss=0, force=False, max_seq_len=MAX_SEQ_LEN)
    assert check["graphs"] == graphs and "unchecked" not in check
    assert "1 graphs that the check kept" in capsys.readouterr().err
    engine.packaged.checked = set(graphs[1:])
    served_graphs(engine, MAX_SEQ_LEN)  # the warm-up runs the graph outside the checked ones: said, once
    assert capsys.readouterr().err.count(f"O2 graph {graphs[0]} runs, which the first-start check") == 1



@pytest.mark.slow
def test_the_check_warms_the_servers_own_loop_so_its_start_does_not_warm_up_again(served):
    engine, recipe, tokenizer = served
    loop = EngineLoop(engine, MAX_SEQ_LEN, max_queue=4)
    served_now = served_graphs(engine, MAX_SEQ_LEN, warm_up=loop.warm_up)
    assert served_now == served_graphs(engine, MAX_SEQ_LEN)  # the loop's runner ran every served graph
    engine.packaged.ran.clear()
    loop.warm_up()  # the start's own warm-up, after the check's
    assert engine.packaged.ran == set()


def _with_metrics(recipe: Recipe, gate: dict | None = None, **metrics) -> Recipe:
    data = copy.deepcopy(recipe.data)
    data["metrics"].update(metrics)
    data["gate"].update(gate or {})
    return Recipe(data)


def test_figures_beyond_the_recipes_spread_are_said_with_both():
    recipe = Recipe({"metrics": {"throughput_tok_s": 200.0, "throughput_min": 190.0, "throughput_max": 210.0,
                                 "peak_memory_mb": 100.0}})
    inside = {"throughput_tok_s": 175.0, "peak_memory_mb": 109.0}  # within 10% of the spread
    assert differences(inside, recipe) == []
    lines = differences({"throughput_tok_s": 120.0, "peak_memory_mb": 250.0}, recipe)
    assert lines == ["throughput 120.0 tok/s here, below the recipe's 190.0-210.0 less 10%",
                     "peak memory 250 MB here, above the recipe's 100 MB plus 10%"]


def test_a_packaged_program_that_fails_the_decode_check_is_refused_unless_forced(served, tmp_path, capsys):
    engine, recipe, tokenizer = served
    failed = {"decode_agreement": 0.95, "decode_positions": 1536, "decode_passed": False, "decode_decided": True,
              "decode_verdict": "fail: 0.9500 over 1536 positions", "throughput_tok_s": 1.0,
              "peak_memory_mb": 1.0, "gate_design": design(), "graphs": sorted(served_graphs(engine, MAX_SEQ_LEN))}
    (tmp_path / CHECK).write_text(json.dumps(failed))
    # Gated before the decode check existed: its recipe has no decode figure to set beside the check's.
    fast = _with_metrics(recipe, gate={"decode_agreement": None}, throughput_tok_s=1.0, throughput_min=1.0,
                         throughput_max=1.0, peak_memory_mb=1.0)
    with pytest.raises(UserInputError, match="does not pass the decode check here .*--force serves it anyway"):
        check_packaged(engine, fast, tokenizer, tmp_path, base_rss=0, force=False, max_seq_len=MAX_SEQ_LEN)
    assert check_packaged(engine, fast, tokenizer, tmp_path, base_rss=0, force=True, max_seq_len=MAX_SEQ_LEN) == failed
    err = capsys.readouterr().err
    assert "served anyway (--force)" in err and "the recipe's gate: -)" in err, err
    slow = _with_metrics(recipe, throughput_tok_s=1000.0, throughput_min=950.0, throughput_max=1050.0)
    check_packaged(engine, slow, tokenizer, tmp_path, base_rss=0, force=True, max_seq_len=MAX_SEQ_LEN)
    assert "WARNING: the packaged program differs from the recipe: throughput 1.0 tok/s here" in \
        capsys.readouterr().err


def test_a_check_made_under_another_decode_check_design_is_made_again(served, tmp_path, capsys, monkeypatch):
    engine, recipe, tokenizer = served
    kept = {"decode_agreement": 1.0, "decode_positions": 1024, "decode_passed": True, "decode_decided": True,
            "decode_verdict": "pass: under the old rule", "throughput_tok_s": 1.0, "peak_memory_mb": 1.0,
            "gate_design": {**design(), "GATE_VERSION": "3"}, "graphs": sorted(served_graphs(engine, MAX_SEQ_LEN))}
    (tmp_path / CHECK).write_text(json.dumps(kept))
    fresh = {**kept, "decode_positions": 1536, "decode_verdict": "pass: today's rule"}
    fresh.pop("gate_design")
    monkeypatch.setattr(first_start, "measure_packaged", lambda *args: dict(fresh))
    check = check_packaged(engine, recipe, tokenizer, tmp_path, base_rss=0, force=True, max_seq_len=MAX_SEQ_LEN)
    assert check == {**fresh, "gate_design": design()} and json.loads((tmp_path / CHECK).read_text()) == check
    assert "checked under another design of the decode check" in capsys.readouterr().err
