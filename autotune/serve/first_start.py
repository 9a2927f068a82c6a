"""A packaged build's first start checks the program it is about to serve. O2 on the CPU is served from AOTInductor
packages compiled at that start (engine/packaged.py), with the serving runner's graphs (a decode graph per batch
bucket, decode steps as wide as their rows' pages, prompts prefilled whole or in chunks), which no trial ran. Before
the server takes a request, the serving runner is warmed up (every graph it will run, compiled or loaded), and that
program runs the decode check against the fp32 reference in arrival patterns that run each of those graphs
(gate/decode.served_decode_check), then one timed run of the recipe's workload. A graph the warm-up ran and the
check did not refuses the start (unless --force); so does a decode check that does not pass. The figures and the
graphs checked are kept with the packages (`check.json` in their folder, emptied with them when the key changes)
and set beside the recipe's on every later start, which checks again where its warm-up runs a graph the kept check
did not; a throughput or memory beyond the recipe's spread and tolerance is said with both figures. A graph that
first runs later, on a request, is said in the log (engine/packaged.py)."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from autotune.benchmark.bench import benchmark_engine
from autotune.benchmark.policy import RunPolicy
from autotune.config.workload import Workload
from autotune.engine import Engine
from autotune.engine.serving import configured_chunk, serving_runner
from autotune.errors import UserInputError
from autotune.gate.corpus import EVAL_POSITIONS, bench_prompts, decode_prompts
from autotune.gate.decode import served_decode_check
from autotune.gate.design import design
from autotune.gate.reference import cached_reference
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, model_checksum
from autotune.paths import write_atomic
from autotune.progress import log
from autotune.recipes.recipe import Recipe
from autotune.recipes.verify import DEFAULT_TOLERANCE

__all__ = ["CHECK", "CHECK_CHUNK", "check_packaged", "measure_packaged", "differences", "served_graphs"]

CHECK = "check.json"
# The check's prefill chunk where the server prefills in chunks: shorter than the decode check's prompts (48 tokens),
# so that each prompt arriving while others decode runs the chunk graph (its length is dynamic: the served one).
CHECK_CHUNK = 16


def measure_packaged(engine: Engine, recipe: Recipe, tokenizer, base_rss: int) -> dict:
    """The decode check on the serving runner's graphs (`graphs`: the packages it ran), then one timed run of the
    recipe's workload."""
    spec = resolve_model(recipe.model)
    gate = recipe.data.get("gate") or {}
    workload = Workload(**recipe.data["workload"])
    reference = cached_reference(model_checksum(spec), tokenizer, EVAL_POSITIONS,
                                 lambda: load_hf_model(spec, "float32"))
    prompts = decode_prompts(tokenizer, eval_positions=EVAL_POSITIONS)
    max_seq_len = max(workload.max_seq_len, max(map(len, prompts)) + reference.decode_top_ids.shape[1])
    chunk = CHECK_CHUNK if configured_chunk(engine.config) is not None else None
    runner = engine.runner(max_seq_len=max_seq_len, pool_tokens=engine.config.batch_size * max_seq_len,
                           prefill_chunk=chunk, bucketed=True)
    log("serve: first start of these packages: the decode check and one timed run on the program to be served")
    engine.packaged.ran.clear()
    decode = served_decode_check(runner, engine.model.eos_token_id, reference, prompts,
                                 gate.get("tie_epsilon", 0.05), gate.get("min_agreement", 0.995))
    checked = sorted(engine.packaged.ran)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    bench = benchmark_engine(engine, prompts, workload, policy=RunPolicy(warmup="full", max_repeats=1),
                             base_rss=base_rss, bucketed=True)
    return {"decode_agreement": decode["decode_agreement"], "decode_positions": decode["decode_positions"],
            "decode_passed": decode["decode_passed"], "decode_decided": decode["decode_decided"],
            "decode_verdict": decode["decode_verdict"], "graphs": checked,
            "throughput_tok_s": bench["throughput_tok_s"], "peak_memory_mb": bench["peak_memory_mb"]}


def differences(check: dict, recipe: Recipe, tolerance: float = DEFAULT_TOLERANCE) -> list[str]:
    """Where the packaged program's figures fall outside the recipe's, each in one line with both figures."""
    metrics = recipe.data["metrics"]
    out = []
    floor = metrics.get("throughput_min") or metrics["throughput_tok_s"]
    if check["throughput_tok_s"] < floor * (1 - tolerance):
        out.append(f"throughput {check['throughput_tok_s']:.1f} tok/s here, below the recipe's "
                   f"{floor:.1f}-{metrics.get('throughput_max') or floor:.1f} less {tolerance:.0%}")
    if metrics.get("peak_memory_mb") and check["peak_memory_mb"] > metrics["peak_memory_mb"] * (1 + tolerance):
        out.append(f"peak memory {check['peak_memory_mb']:.0f} MB here, above the recipe's "
                   f"{metrics['peak_memory_mb']:.0f} MB plus {tolerance:.0%}")
    return out


def served_graphs(engine: Engine, max_seq_len: int, warm_up: Callable[[], None] | None = None) -> set[str]:
    """The packages a serving runner's warm-up runs (every graph the server will run), compiled or loaded now.
    `warm_up`: the server's own (serve/engine_loop.py EngineLoop.warm_up), so that its start does not warm up
    twice; else a serving runner of its own is warmed."""
    engine.packaged.ran.clear()
    (warm_up or serving_runner(engine, max_seq_len).warm_up)()
    return set(engine.packaged.ran)


def check_packaged(engine: Engine, recipe: Recipe, tokenizer, folder: Path, base_rss: int, force: bool,
                   max_seq_len: int, warm_up: Callable[[], None] | None = None) -> dict:
    """The packaged program's check: measured now where `folder` (the packages') holds none that ran every graph
    the server's warm-up (at `max_seq_len`; `warm_up`, the server's own: served_graphs) runs, else the one kept
    there. Says the figures beside the recipe's; refuses a decode check that did not pass, or one that did not run
    every served graph, unless `force`."""
    path = folder / CHECK
    served = served_graphs(engine, max_seq_len, warm_up)
    try:
        check = json.loads(path.read_text())
    except (OSError, ValueError):
        check = None
    if check is not None and check.get("gate_design") != design():
        # Kept with packages that outlive a change of the decode check's sizes or rule: its verdict is not today's.
        log(f"serve: {path} was checked under another design of the decode check: checked again")
        check = None
    if check is not None and not served <= set(check.get("graphs") or ()):
        log(f"serve: the server runs {len(served - set(check.get('graphs') or ()))} graphs that the check kept in "
            f"{path} did not run: checked again")
        check = None
    if check is None:
        check = {**measure_packaged(engine, recipe, tokenizer, base_rss), "gate_design": design()}
        if unchecked := sorted(served - set(check["graphs"])):
            check["unchecked"] = unchecked
        write_atomic(path, json.dumps(check, indent=1).encode())
    else:
        log(f"serve: these packages were checked at their first start ({path})")
    engine.packaged.checked = set(check["graphs"])
    gate = recipe.data.get("gate") or {}
    recorded = gate.get("decode_agreement")  # None for a recipe gated before the decode check
    log(f"serve: packaged program: decode {check['decode_agreement']:.4f} over {check['decode_positions']} "
        f"positions ({check['decode_verdict'].split(':')[0]}; the recipe's gate: "
        f"{'-' if recorded is None else format(recorded, '.4f')}), {check['throughput_tok_s']:.1f} tok/s (recipe "
        f"{recipe.data['metrics']['throughput_tok_s']:.1f}), peak memory {check['peak_memory_mb']:.0f} MB (recipe "
        f"{recipe.data['metrics'].get('peak_memory_mb') or 0:.0f})")
    for line in differences(check, recipe):
        log(f"serve: WARNING: the packaged program differs from the recipe: {line}")
    if check.get("unchecked"):
        why = (f"the first-start check did not run {len(check['unchecked'])} of the graphs the server runs "
               f"({', '.join(check['unchecked'])})")
        if not force:
            raise UserInputError(f"{why}: they would serve unchecked; --force serves them anyway")
        log(f"serve: WARNING: {why}; served anyway (--force)")
    # A marginal verdict is what the recipe itself had where it was accepted so (search --accept-marginal).
    if not check["decode_passed"] and not (gate.get("accepted_marginal") and check["decode_decided"] is False):
        why = (f"the packaged program does not pass the decode check here ({check['decode_verdict']}), though the "
               "recipe's build did")
        if not force:
            raise UserInputError(f"{why}: it is not the program that was gated; `autotune verify` re-gates the "
                                 f"recipe, and --force serves it anyway")
        log(f"serve: WARNING: {why}; served anyway (--force)")
    return check
