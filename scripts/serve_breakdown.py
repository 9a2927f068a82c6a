"""Where served throughput goes, without HTTP: one recipe's engine, built once, runs the recipe's workload through
the offline runner and through the server's runner, on this one thread, alternating, medians.

    python scripts/serve_breakdown.py RECIPE [--rounds 3] [--stages offline,offline-512,serving,serving-whole]

offline: the benchmark's runner (context sized to the workload). offline-512: the same at the server's context
(the recipe's max_seq_len). serving: the server's runner (decode buckets, prefill in chunks while rows decode).
serving-whole: the same without chunks. Each line splits the wall time into prefill, chunked prefill, decode (with
the decode steps per bucket) and the rest (the runner's Python). `scripts/bench_serve.py` gives the served figure
(HTTP, client) beside the offline one."""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.config.workload import Workload  # noqa: E402
from autotune.engine import Request  # noqa: E402
from autotune.gate.corpus import bench_prompts  # noqa: E402
from autotune.recipes.recipe import load_recipe  # noqa: E402
from autotune.recipes.target import place  # noqa: E402
from autotune.serve.app import engine_for  # noqa: E402
from autotune.serve.engine_loop import PREFILL_CHUNK  # noqa: E402

STAGES = ("offline", "offline-512", "serving", "serving-whole")


def _timed(model, spent: dict, steps: collections.Counter) -> None:
    """Wrap the model's forwards to add up their wall time (and count decode steps per bucket)."""
    for name in ("prefill", "prefill_chunk", "decode"):
        forward = getattr(model, name)

        def timed(*args, forward=forward, name=name, **kwargs):
            started = time.perf_counter()
            out = forward(*args, **kwargs)
            spent[name] += time.perf_counter() - started
            steps[f"{name}@{args[0].shape[0]}" if name == "decode" else name] += 1
            return out

        setattr(model, name, timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", default=",".join(STAGES))
    args = parser.parse_args()
    stages = args.stages.split(",")
    if unknown := set(stages) - set(STAGES):
        parser.error(f"unknown stages {sorted(unknown)}: choose from {', '.join(STAGES)}")
    recipe = load_recipe(args.recipe)
    workload = Workload(**recipe.data["workload"])
    engine, tokenizer, max_seq_len = engine_for(recipe, place(recipe), check_weights=False)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    eos = engine.model.eos_token_id
    batch = engine.config.batch_size

    def requests() -> list[Request]:
        return [Request(p, workload.output_tokens, min_new_tokens=workload.output_tokens, eos_token_id=eos)
                for p in prompts]

    def runner(stage: str):
        seq = workload.max_seq_len if stage == "offline" else max_seq_len
        serving = stage.startswith("serving")
        return engine.runner(max_seq_len=seq, pool_tokens=batch * seq, bucketed=serving,
                             prefill_chunk=PREFILL_CHUNK if stage == "serving" else None)

    runners = {stage: runner(stage) for stage in stages}
    for stage, r in runners.items():  # compile (each runner's shapes) and warm up, untimed
        print(f"warming up {stage}", flush=True)
        engine.model.attach(r.cache)
        r.run(requests())
    spent: dict = collections.defaultdict(float)
    steps: collections.Counter = collections.Counter()
    _timed(engine.model, spent, steps)
    figures: dict = collections.defaultdict(list)
    tokens = workload.num_requests * workload.output_tokens
    for i in range(args.rounds):
        for stage, r in runners.items():
            spent.clear()
            steps.clear()
            engine.model.attach(r.cache)
            started = time.perf_counter()
            r.run(requests())
            wall = time.perf_counter() - started
            figures[stage].append(tokens / wall)
            buckets = ", ".join(f"{k.split('@')[1]}:{v}" for k, v in sorted(steps.items()) if k.startswith("decode@"))
            print(f"round {i + 1} {stage:>13}: {tokens / wall:6.1f} tok/s, wall {wall:5.2f} s = prefill "
                  f"{spent['prefill']:.2f} s ({steps['prefill']}) + chunks {spent['prefill_chunk']:.2f} s "
                  f"({steps['prefill_chunk']}) + decode {spent['decode']:.2f} s (steps per bucket {buckets}) + rest "
                  f"{wall - sum(spent.values()):.2f} s", flush=True)
    base = statistics.median(figures[stages[0]])
    print(f"\n{recipe.path}: {recipe.config.label()}; medians of {args.rounds} rounds")
    for stage in stages:
        m = statistics.median(figures[stage])
        print(f"  {stage:>13}: {m:6.1f} tok/s  {m / base:.2f} of {stages[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
