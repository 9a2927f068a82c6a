"""Test helper: a study with every outcome (front, dominated, gated, failed), made by the real study loop over the
scripted backend of test_study.py, with its recipes exported (which writes the dashboard notes and artifacts)."""
from __future__ import annotations

from pathlib import Path

import optuna
from test_study import ScriptedBackend

from autotune.results.export import write_recipes
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.space.serving_knobs import offline_space
from autotune.study.loop import run_search
from autotune.study.settings import OBJECTIVES, SearchSettings, make_sampler
from autotune.study.setup import enqueue_baseline

WORKLOAD = {"num_requests": 4, "prompt_min": 12, "prompt_max": 20, "output_tokens": 8, "arrival": "offline",
            "seed": 0}
# The figures a real gate records beside agreement (the recipe schema asks for them).
GATE_FIGURES = {"perplexity": 10.0, "reference_perplexity": 9.9, "kl_divergence": 0.001, "decode_agreement": 1.0,
                "decode_raw_agreement": 0.99, "decode_first_miss": None, "decode_positions": 1024, "positions": 4088,
                "tie_epsilon": 0.05, "min_agreement": 0.995}


class FullGateBackend(ScriptedBackend):
    def run(self, job, timeout_s):
        result = super().run(job, timeout_s)
        if result.gate is not None:
            result.gate = {**GATE_FIGURES, **result.gate}
        return result


def scripted_study(folder: Path, name: str = "view", trials: int = 24) -> tuple[optuna.Study, str, Path]:
    """(study, storage URL, recipes folder); AUTOTUNE_CACHE must point somewhere private (the gate cache)."""
    url = f"sqlite:///{folder}/{name}.db"
    study = optuna.create_study(study_name=name, storage=url, load_if_exists=True,
                                directions=[d for _, d in OBJECTIVES], sampler=make_sampler("random", 0))
    study.set_metric_names([n for n, _ in OBJECTIVES])
    attrs = {"model_checksum": "sha256:x", "eval_digest": "d", "model": "m", "model_source": "test",
             "backend": "scripted", "measured": True, "hardware": {"hardware": "test-machine"}, "workload": WORKLOAD,
             "min_agreement": 0.995,
             "speed_baseline": {"what": "transformers generate, bf16, eager", "batch_size": 8,
                                "bench": {"throughput_tok_s": 150.0, "tpot_p99_ms": 30.0, "peak_memory_mb": 500.0,
                                          "ttft_p50_ms": 80.0, "ttft_p99_ms": 90.0}}}
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    space = offline_space(load_space(DEFAULT_SPACE))  # as an offline search has it
    settings = SearchSettings(model="m", study=name, storage=url, trials=trials)
    enqueue_baseline(study, space)  # as the set-up does
    run_search(settings, space, FullGateBackend(), study)
    recipes = folder / "recipes"
    write_recipes(study, recipes, url)
    return study, url, recipes
