"""Queue the device check's configurations on its study, in the order they should run, before `autotune search`
takes the study up (waiting trials run first, and with --trials equal to their number nothing else runs).

Usage: python plan.py STUDY STORAGE SPACE (prints the number of queued trials). Each configuration is one point of
the space (checked), chosen for what the check must show on the device: eager bf16 (the baseline), int4 on the
device (tinygemm, a group size per layer), O1 (inductor), compiled w8a8 at decode batches of 8 and fewer (cuBLAS's
int8 GEMM takes more than 16 rows), and O2 last, the longest to compile (max-autotune, with CUDA graphs over static
KV pools)."""
from __future__ import annotations

import sys

import optuna

from autotune.space.search_space import load_space
from autotune.study.settings import OBJECTIVES

CONFIGS: list[dict] = [
    {"dtype": "bf16", "quant": "none", "fusion_level": "O0"},
    {"dtype": "bf16", "quant": "w4a16", "fusion_level": "O0"},
    {"dtype": "bf16", "quant": "none", "fusion_level": "O1", "layers_per_subgraph": "all"},
    {"dtype": "bf16", "quant": "w8a8", "fusion_level": "O1", "layers_per_subgraph": "all"},
    {"dtype": "bf16", "quant": "none", "fusion_level": "O2", "layers_per_subgraph": "all"},
]


def main(study_name: str, storage: str, space_path: str) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(space_path)
    base = space.baseline_params()
    grid = space.grid()
    study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True,
                                directions=[d for _, d in OBJECTIVES])
    for i, config in enumerate(CONFIGS):
        params = {**base, **config}
        assert params in grid, f"{params} is not a point of {space_path}"
        role = {"role": "baseline"} if params == base else {}
        study.enqueue_trial(space.trial_params(params), user_attrs=role)
        print(f"  queued {i + 1}/{len(CONFIGS)}: {space.to_config(params).label()}", file=sys.stderr)
    print(len(CONFIGS))  # the number of trials to run, for the caller
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
