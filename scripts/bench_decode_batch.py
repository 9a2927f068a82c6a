"""An O2 decode step from one package per batch bucket (static batch) against one package for every batch of two
rows or more (dynamic batch: engine/packaged.py BATCH_DIMS), on the same model and configuration, in one process,
rounds alternating.

    python scripts/bench_decode_batch.py [--model smollm2-135m] [--batch 16] [--rounds 7]

Each arm builds the bf16/O2 engine (all layers in one graph) with packages in a scratch folder of its own and runs
the offline workload of the benchmark's shape (`batch` prompts of 120 tokens and more, 64 new tokens each) once to
compile its graphs. Then each round runs it again in each arm and times every decode forward: the figure is the
median decode step at the full batch, and the run's wall time. What the dynamic arm saves is compiles: a serving
runner of batch 16 decodes in five buckets (1, 2, 4, 8, 16), five packages in the static arm, two in the dynamic one.
Each round goes to docs/data/bench_decode_batch-MODEL-HARDWARE.json (bench_record.py)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from autotune.backends import get_backend  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.engine import Request, build_engine  # noqa: E402
from autotune.engine.packaged import BATCH_DIMS  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_hf_model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import compare, machine, spread, write  # noqa: E402
from bench_tables import decode_batch_table  # noqa: E402

NEW_TOKENS = 64
ARMS = ("static", "dynamic")


def _arm(name: str, spec, config: DeployConfig, prompts: list[list[int]], folder: Path):
    """The arm's engine, its runner and the list its decode forwards' times go to; its graphs compiled."""
    saved = dict(BATCH_DIMS)
    if name == "static":  # a package per batch bucket, as dynamo keeps a graph per bucket
        BATCH_DIMS.clear()
    try:
        engine = build_engine(load_hf_model(spec, "float32"), config, packages=folder)
        steps: list[float] = []
        inner = engine.model.decode

        def timed(*args, **kwargs):
            started = time.perf_counter()
            out = inner(*args, **kwargs)
            steps.append(time.perf_counter() - started)
            return out

        engine.model.decode = timed
        runner = engine.runner(max_seq_len=max(map(len, prompts)) + NEW_TOKENS, pool_tokens=None)
        runner.run([Request(p, NEW_TOKENS, min_new_tokens=NEW_TOKENS) for p in prompts])
    finally:
        BATCH_DIMS.update(saved)
    return engine, runner, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    backend = get_backend("cpu")
    torch.set_num_threads(backend.fingerprint()["cores"])
    spec = resolve_model(args.model)
    config = DeployConfig(fusion_level="O2", layers_per_subgraph=0, batch_size=args.batch, page_size=16,
                          dtype="bf16")
    # Token ids of no meaning, lengths as the benchmark's prompts (112-144 tokens): the step's cost is its shapes.
    prompts = [[(7 * i + j) % 4000 + 10 for j in range(120 + i)] for i in range(args.batch)]
    arms = {}
    with tempfile.TemporaryDirectory(prefix="bench-decode-batch-") as scratch:
        for name in ARMS:
            print(f"{name}: building and compiling", flush=True)
            arms[name] = _arm(name, spec, config, prompts, Path(scratch) / name)
        rounds: dict[str, list[dict]] = {name: [] for name in ARMS}
        for r in range(args.rounds):
            for name, (_, runner, steps) in arms.items():
                steps.clear()
                started = time.perf_counter()
                runner.run([Request(p, NEW_TOKENS, min_new_tokens=NEW_TOKENS) for p in prompts])
                wall = time.perf_counter() - started
                full = steps[:NEW_TOKENS - 1]  # every row decodes to the end: each step is at the full batch
                rounds[name].append({"run_s": round(wall, 4),
                                     "decode_step_ms": round(1000 * statistics.median(full), 3),
                                     "decode_steps": len(steps)})
                print(f"round {r + 1}/{args.rounds} {name}: {wall:.3f} s, decode step "
                      f"{rounds[name][-1]['decode_step_ms']:.2f} ms", flush=True)
        compile_s = {name: round(engine.packaged.compile_seconds, 1) for name, (engine, _, _) in arms.items()}
    figures = {name: {"decode_step_ms": spread([r["decode_step_ms"] for r in rounds[name]]),
                      "run_s": spread([r["run_s"] for r in rounds[name]]), "compile_s": compile_s[name]}
               for name in ARMS}
    fingerprint = backend.fingerprint()
    record = {"kind": "decode_batch", "machine": machine(fingerprint), "model": args.model,
              "configuration": config.label(), "arms": figures, "rounds": rounds,
              "order": compare([r["decode_step_ms"] for r in rounds["dynamic"]],
                               [r["decode_step_ms"] for r in rounds["static"]])}
    write(f"bench_decode_batch-{Path(args.model).name}-{fingerprint['hardware']}", record)
    print(decode_batch_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
