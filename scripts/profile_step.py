"""Where an offline run's time goes, step by step, in our recipe's engine and in OpenVINO GenAI at its defaults: the
same model, prompts, batch and threads, each engine in a fresh process of its own, rounds alternating.

    python scripts/profile_step.py [--recipe RECIPE] [--rounds 5]

Each run is split into its phases by timing every forward (ours) or scheduler step (OpenVINO) of it:
- prefill: until every prompt is in the KV cache. Ours prefills whole prompts in forwards of similar lengths
  (engine/scheduler.py `length_groups`), padded to each forward's longest; OpenVINO's steps take 256 tokens of
  prompts each and carry the decode rows of the prompts already done, so some output tokens are made in this phase;
- decode: the steps after it, one token per running sequence, and the median step at the full batch;
- the rest: the wall time outside those calls (sampling, inputs, scheduling, reading outputs).
The table compares the medians figure by figure: what ours spends more, and where."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends import get_backend  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.engine.sequence import Request  # noqa: E402
from autotune.gate.corpus import bench_prompts  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_tokenizer, model_checksum  # noqa: E402
from autotune.openvino.config import PIPELINE_DEFAULTS  # noqa: E402
from autotune.recipes.recipe import load_recipe  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peer import _best_recipe, _peer_files, _peer_runner  # noqa: E402
from bench_record import compare, machine, spread, write  # noqa: E402
from bench_tables import profile_table  # noqa: E402

RECIPES = "recipes/smollm2-135m/cpu-amd-epyc-zen4-avx512bf16-2c"


class _Timed:
    """Wraps a callable: every call's seconds and what `note` makes of its arguments."""

    def __init__(self, fn, note=lambda *a, **k: None) -> None:
        self.fn, self.note, self.calls = fn, note, []

    def __call__(self, *args, **kwargs):
        info = self.note(*args, **kwargs)
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.calls.append((time.perf_counter() - t0, info))
        return out


def _ours_phases(runner, requests, batch: int) -> dict:
    model = runner.model
    prefill = _Timed(model.prefill, lambda ids, slots, lengths, *a, **k: (ids.numel(), int(lengths.sum())))
    decode = _Timed(model.decode, lambda tokens, *a, **k: len(tokens))
    model.prefill, model.decode = prefill, decode
    try:
        t0 = time.perf_counter()
        runner.run(requests)
        wall = time.perf_counter() - t0
    finally:
        model.prefill, model.decode = prefill.fn, decode.fn
    full = [s for s, rows in decode.calls if rows == batch]
    prefill_s, decode_s = sum(s for s, _ in prefill.calls), sum(s for s, _ in decode.calls)
    return {"wall_s": wall, "prefill_s": prefill_s, "prefill_forwards": len(prefill.calls),
            "prompt_tokens": sum(i[1] for _, i in prefill.calls),
            "computed_tokens": sum(i[0] for _, i in prefill.calls),
            "prefill_output_tokens": len(requests),
            "decode_steps": len(decode.calls), "decode_s": decode_s,
            "decode_step_ms_full": statistics.median(full) * 1e3 if full else None,
            "rest_s": wall - prefill_s - decode_s}


def _openvino_phases(runner, requests, batch: int) -> dict:
    pipe, steps = runner.pipe, []

    class _Steps:  # the pipeline's step, timed, with how many prompts were still unfinished and rows decoding
        def __getattr__(self, name):
            return getattr(pipe, name)

        def step(self):
            live = list(runner._live.values())
            waiting = sum(not c.output_ids for c in live)
            decoding = sum(bool(c.output_ids) and not c.finish_reason for c in live)
            t0 = time.perf_counter()
            pipe.step()
            steps.append((time.perf_counter() - t0, waiting, decoding))

    runner.pipe = _Steps()
    try:
        t0 = time.perf_counter()
        runner.run(requests)
        wall = time.perf_counter() - t0
    finally:
        runner.pipe = pipe
    prefill = [(s, d) for s, w, d in steps if w]
    decode = [(s, d) for s, w, d in steps if not w]
    prefill_s, decode_s = sum(s for s, _ in prefill), sum(s for s, _ in decode)
    full = [s for s, d in decode if d == batch]
    prompt = sum(len(r.prompt_ids) for r in requests)
    return {"wall_s": wall, "prefill_s": prefill_s, "prefill_forwards": len(prefill), "prompt_tokens": prompt,
            "computed_tokens": prompt, "prefill_output_tokens": len(requests) + sum(d for _, d in prefill),
            "decode_steps": len(decode), "decode_s": decode_s,
            "decode_step_ms_full": statistics.median(full) * 1e3 if full else None,
            "rest_s": wall - prefill_s - decode_s}


def _worker(engine: str, recipe_path: str) -> int:
    recipe = load_recipe(recipe_path)
    workload = Workload(**recipe.data["workload"])
    threads = recipe.data.get("threads") or recipe.config.device_power
    batch = recipe.config.batch_size
    if engine == "ours":
        from autotune.recipes.target import place
        from autotune.serve.app import engine_for

        built, tokenizer, _ = engine_for(recipe, place(recipe), check_weights=False)
        runner = built.runner(max_seq_len=workload.max_seq_len, pool_tokens=batch * workload.max_seq_len)
        phases = _ours_phases
    else:
        spec = resolve_model(recipe.model)
        tokenizer = load_tokenizer(spec)
        config = replace(PIPELINE_DEFAULTS, batch_size=batch, device_power=threads)
        runner = _peer_runner(_peer_files(spec, model_checksum(spec), tokenizer, config, threads), config, threads)
        phases = _openvino_phases
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)
    n = workload.output_tokens
    requests = lambda: [Request(p, n, min_new_tokens=n) for p in prompts]  # noqa: E731
    runner.run(requests())  # graphs compiled, kernels warm
    print("ready", flush=True)
    for _ in sys.stdin:
        print(json.dumps(phases(runner, requests(), batch)), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", help=f"default: the highest-throughput recipe of {RECIPES}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipe_path = args.recipe or _best_recipe(RECIPES)
    if args.worker:
        return _worker(args.worker, recipe_path)
    recipe = load_recipe(recipe_path)
    if recipe.config.runtime != "engine":
        raise SystemExit(f"{recipe_path} is a {recipe.config.runtime} recipe: profile_step compares our engine's")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    procs = {}
    for engine in ("ours", "openvino"):
        print(f"{engine}: build and warm up", flush=True)
        procs[engine] = subprocess.Popen([sys.executable, __file__, "--recipe", recipe_path, "--worker", engine],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        _read(procs[engine], "ready")
    rounds: dict[str, list[dict]] = {e: [] for e in procs}
    try:
        for r in range(args.rounds):
            for engine in procs if r % 2 == 0 else list(procs)[::-1]:
                procs[engine].stdin.write("run\n")
                procs[engine].stdin.flush()
                rounds[engine].append(json.loads(_read(procs[engine], "{")))
                print(f"round {r + 1}/{args.rounds} {engine}: {json.dumps(rounds[engine][-1])}", flush=True)
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=120)
    fingerprint = get_backend("cpu").fingerprint()
    workload = recipe.data["workload"]
    tokens = workload["num_requests"] * workload["output_tokens"]
    engines = {e: {"throughput": spread([tokens / f["wall_s"] for f in runs]), "runs": runs}
               for e, runs in rounds.items()}
    mine, theirs = engines["ours"]["throughput"], engines["openvino"]["throughput"]
    engines["openvino"]["ours_ratio"] = round(mine["median"] / theirs["median"], 3)
    engines["openvino"]["order"] = compare(mine["rounds"], theirs["rounds"])
    engines["ours"]["configuration"] = f"recipe {recipe.config.label()}"
    engines["openvino"]["configuration"] = replace(PIPELINE_DEFAULTS, batch_size=recipe.config.batch_size,
                                                   device_power=recipe.data.get("threads") or 0).label()
    record = {"kind": "profile", "machine": machine(fingerprint),
              "recipe": {"path": recipe_path, "model": recipe.model, "label": recipe.config.label()},
              "workload": workload, "batch": recipe.config.batch_size, "rounds": rounds, "engines": engines}
    write(f"profile_step-{Path(recipe.model).name}-{fingerprint['hardware']}", record)
    print(profile_table(record))
    return 0


def _read(proc, prefix: str) -> str:
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
        print("  " + line.rstrip(), flush=True)
    raise SystemExit(f"a worker exited ({proc.wait()})")


if __name__ == "__main__":
    sys.exit(main())
