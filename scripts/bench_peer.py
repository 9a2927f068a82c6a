"""The peer engines (OpenVINO GenAI, llama.cpp) beside autotune's best recipe, on the same model, workload, prompts
and thread count, in one run.

    python scripts/bench_peer.py [--recipe RECIPE] [--peers openvino,llamacpp] [--types source,Q8_0,F16,BF16]
                                 [--parallel 8] [--rounds 3] [--best LLAMACPP_RECIPE] [--best-openvino RECIPE] [--gate]

Each engine runs in a fresh process of its own, built once: the recipe's engine (as `autotune serve` builds it; one
timed run of the workload through the benchmark's own code per request), and one llama.cpp process per
configuration (llama-cpp-python's low-level API: the model memory-mapped, one context with the configuration's
knobs, the workload's requests through `parallel` sequences with continuous batching and greedy choices, as
llama-server's slots run them, without HTTP). The rounds run one timed run of every engine in turn, the order
reversed every other round, so that the machine's drift falls on all of them alike; the table has the medians.
Rows: the recipe; llama.cpp as llama-server runs given only the shipped GGUF (its defaults: 4 slots, the model's
trained context, batch 2048/512, flash attention auto, f16 KV); each GGUF type at --parallel sequences; and --best,
the configuration of a recipe of `autotune search --backend llamacpp` (llama.cpp's knobs, searched and gated).
OpenVINO's rows: its defaults as a user runs them after `optimum-cli export openvino --weight-format fp16`, with
max_num_seqs at the recipe's batch and the recipe's threads (openvino/config.py PIPELINE_DEFAULTS), and
--best-openvino, the configuration of an OpenVINO recipe (searched and gated); each through the pipeline's steps as
its trials run it (autotune/openvino/pipeline.py). A recipe that is itself OpenVINO's runs as a peer row does.
Peak memory: each process's high-water mark during its runs, minus its resident size before the weights were loaded
(its interpreter and libraries). --gate adds each llama.cpp configuration's accuracy gate (llama.cpp's logits
against the fp32 reference) before its timed runs."""
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
from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak, rss_bytes, trim_heap  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.gate.corpus import bench_prompts  # noqa: E402
from autotune.llamacpp.build_info import installed as llamacpp_installed  # noqa: E402
from autotune.llamacpp.config import SERVER_DEFAULTS, llamacpp_config  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_tokenizer, model_checksum  # noqa: E402
from autotune.openvino.build_info import installed as openvino_installed  # noqa: E402
from autotune.openvino.config import PIPELINE_DEFAULTS, openvino_config  # noqa: E402
from autotune.recipes.recipe import load_recipe  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import compare, machine, spread, write  # noqa: E402
from bench_tables import peer_table  # noqa: E402

RECIPES = "recipes/smollm2-135m/cpu-intel-xeon-processor-intel-f6m167-amx-2c"


def _installed(peer: str) -> bool:
    return (openvino_installed() if peer == "openvino" else llamacpp_installed()) is not None


def _best_recipe(folder: str) -> str:
    """The recipe of highest measured throughput in the folder (a name-by-digest file, not an alias)."""
    paths = sorted(p for p in Path(folder).glob("*.yaml") if not p.stem.startswith(("best-", "smallest-")))
    return str(max(paths, key=lambda p: load_recipe(p).data["metrics"]["throughput_tok_s"]))


def _ours_worker(recipe_path: str) -> int:
    from autotune.benchmark.bench import benchmark_engine
    from autotune.benchmark.policy import RunPolicy
    from autotune.recipes.target import place
    from autotune.serve.app import engine_for

    recipe = load_recipe(recipe_path)
    base_rss = rss_bytes()
    engine, tokenizer, _ = engine_for(recipe, place(recipe), check_weights=False)
    workload = Workload(**recipe.data["workload"])
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)
    warmup = "full"  # the first request compiles (a fused recipe) and settles; later ones warm up briefly
    print("ready", flush=True)
    for _ in sys.stdin:
        policy = RunPolicy(warmup=warmup, min_repeats=1, max_repeats=1, time_cap_s=600.0)
        print(json.dumps(benchmark_engine(engine, prompts, workload, policy=policy, base_rss=base_rss)), flush=True)
        warmup = "short"
    return 0


def _peer_files(spec, checksum: str, tokenizer, config: DeployConfig, threads: int):
    """The peer's files for `config`, made before the memory base (a quantizer's or exporter's memory is not the
    engine's): llama.cpp's GGUF of its type, OpenVINO's IR of its weight format."""
    if config.runtime == "llamacpp":
        from autotune.llamacpp.gguf_files import gguf_file

        return gguf_file(spec, checksum, config.gguf_type, threads)
    from autotune.openvino.ir_files import SAMPLES, ir_folder
    from autotune.quant.calib_set import calibration_samples

    samples = calibration_samples(tokenizer, SAMPLES) if config.knobs.reads_calibration() else None
    return ir_folder(spec, checksum, config.knobs, samples)


def _peer_runner(path: Path, config: DeployConfig, threads: int):
    if config.runtime == "llamacpp":
        from autotune.llamacpp.engine import LlamaCppModel

        return LlamaCppModel(path).context(config, threads)
    from autotune.openvino.pipeline import OpenVinoPipeline

    return OpenVinoPipeline(path, config, threads)


def _peer_worker(model_name: str, config: DeployConfig, threads: int, workload: Workload, gate: bool) -> int:
    from autotune.benchmark.bench import run_figures
    from autotune.engine.sequence import Request

    spec = resolve_model(model_name)
    tokenizer = load_tokenizer(spec)
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)
    checksum = model_checksum(spec)
    threads = config.device_power or threads
    path = _peer_files(spec, checksum, tokenizer, config, threads)
    trim_heap()
    base_rss = rss_bytes()
    size = sum(f.stat().st_size for f in ([path] if path.is_file() else path.glob("*.bin")))
    header: dict = {"path": str(path), "size_mb": size / 2**20}
    runner = _peer_runner(path, config, threads)
    if gate:
        from autotune.gate.corpus import decode_prompts, eval_windows
        from autotune.gate.peer import peer_gate
        from autotune.gate.reference import cached_reference
        from autotune.models.weights import load_hf_model

        ref = cached_reference(checksum, tokenizer, 4096, lambda: load_hf_model(spec, "float32"))
        header["gate"] = peer_gate(runner, ref, eval_windows(tokenizer), decode_prompts(tokenizer)).to_dict()
        if config.runtime == "llamacpp":  # the gate's context apart from the benchmark's, as in its trials
            runner.close()
            runner = _peer_runner(path, config, threads)
        else:
            runner.drop_stateful()
    n = workload.output_tokens
    requests = [Request(p, n, min_new_tokens=n) for p in prompts]
    runner.run([Request(p, 4, min_new_tokens=4) for p in prompts[:config.batch_size]])  # warm-up: a short wave
    print("ready " + json.dumps(header), flush=True)
    for _ in sys.stdin:
        trim_heap()
        reset_peak()
        t0 = time.perf_counter()
        completions = runner.run(requests)
        figures = run_figures(completions, time.perf_counter() - t0)
        figures["peak_memory_mb"] = (peak_rss_bytes() - base_rss) / 2**20
        print(json.dumps(figures), flush=True)
    return 0


class _Worker:
    """A benchmark process, driven one timed run at a time."""

    def __init__(self, label: str, argv: list[str]) -> None:
        self.label = label
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, __file__, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self.header = json.loads(self._until(lambda line: line.startswith("ready")).removeprefix("ready") or "{}")

    def _until(self, done) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip()
            if done(line):
                return line
            print(f"  {self.label}: {line}", flush=True)
        raise SystemExit(f"the {self.label} process exited ({self.proc.wait()})")

    def run(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return json.loads(self._until(lambda line: line.startswith("{")))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", help=f"default: the highest-throughput recipe of {RECIPES}")
    parser.add_argument("--peers", default=",".join(p for p in ("openvino", "llamacpp") if _installed(p)),
                        help="the peer engines to run (default: those installed here)")
    parser.add_argument("--types", default="source,Q8_0,F16,BF16")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--threads", help="llama.cpp's thread counts for the type rows (default: the recipe's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--best", help="a recipe of the llamacpp backend: its configuration, one more row")
    parser.add_argument("--best-openvino", help="an OpenVINO recipe: its configuration, one more row")
    parser.add_argument("--gate", action="store_true", help="gate each peer configuration first")
    parser.add_argument("--no-ours", action="store_true", help="peer rows only (no ratio)")
    parser.add_argument("--ours-worker", help=argparse.SUPPRESS)
    parser.add_argument("--peer-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ours_worker:
        return _ours_worker(args.ours_worker)
    recipe_path = args.recipe or _best_recipe(RECIPES)
    recipe = load_recipe(recipe_path)
    workload = Workload(**recipe.data["workload"])
    threads = recipe.data.get("threads") or recipe.config.device_power
    if args.peer_worker:
        return _peer_worker(recipe.model, DeployConfig.from_dict(json.loads(args.peer_worker)), threads, workload,
                            args.gate)

    peers = [p for p in args.peers.split(",") if p]
    rows: list[tuple[str, DeployConfig]] = []
    if "openvino" in peers:
        rows.append(("OpenVINO defaults, fp16 export", replace(PIPELINE_DEFAULTS, batch_size=recipe.config.batch_size,
                                                               device_power=threads)))
        if args.best_openvino:
            rows.append((f"OpenVINO's search: {args.best_openvino}",
                         openvino_config(load_recipe(args.best_openvino).config)))
    if "llamacpp" in peers:
        base = replace(SERVER_DEFAULTS, batch_size=args.parallel, n_ctx=4096)
        rows.append(("llama-server defaults, shipped GGUF", SERVER_DEFAULTS))
        counts = [int(n) for n in args.threads.split(",")] if args.threads else [threads]
        rows += [(f"{t}, np {args.parallel}, {n} threads", replace(base, gguf_type=t, device_power=n))
                 for n in counts for t in args.types.split(",")]
        if args.best:
            rows.append((f"llama.cpp's search: {args.best}", llamacpp_config(load_recipe(args.best).config)))
    print(f"recipe {recipe_path}: {recipe.config.label()}; {threads} threads; workload {workload.num_requests} "
          f"requests, prompts {workload.prompt_min}-{workload.prompt_max} tokens, {workload.output_tokens} new",
          flush=True)
    workers: list[_Worker] = []
    try:
        if not args.no_ours:
            print("ours: build and warm up", flush=True)
            # A recipe of a peer runtime (the search's best may be OpenVINO's) runs as that peer's rows do.
            own = recipe.config.runtime == "engine"
            argv = ["--ours-worker", recipe_path] if own else ["--peer-worker", json.dumps(recipe.config.to_dict())]
            workers.append(_Worker("ours", ["--recipe", recipe_path, *argv]))
        for label, config in rows:
            print(f"{label}: {config.label()}", flush=True)
            argv = ["--recipe", recipe_path, "--peer-worker", json.dumps(config.to_dict())]
            workers.append(_Worker(label, argv + (["--gate"] if args.gate else [])))
        figures: dict[str, list[dict]] = {w.label: [] for w in workers}
        for r in range(args.rounds):
            for w in workers if r % 2 == 0 else workers[::-1]:
                figures[w.label].append(w.run())
                print(f"round {r + 1}/{args.rounds} {w.label}: {figures[w.label][-1]['throughput_tok_s']:.1f} tok/s "
                      f"{json.dumps(figures[w.label][-1])}", flush=True)
    finally:
        for w in workers:
            w.close()
    fingerprint = get_backend("cpu").fingerprint()
    configs = dict(rows)
    ours = figures.get("ours")
    engines = {}
    for w in workers:
        runs = [f["throughput_tok_s"] for f in figures[w.label]]
        engine = {"configuration": configs[w.label].label() if w.label in configs else
                  f"recipe {recipe.config.label()}", "throughput": spread(runs), "runs": figures[w.label],
                  "gate": w.header.get("gate")}
        if ours is not None and w.label != "ours":
            mine = [f["throughput_tok_s"] for f in ours]
            engine["ours_ratio"] = round(statistics.median(mine) / engine["throughput"]["median"], 3)
            engine["order"] = compare(mine, runs)
        engines[w.label] = engine
    record = {"kind": "peer", "machine": machine(fingerprint), "recipe": {"path": recipe_path, "model": recipe.model,
              "label": recipe.config.label()}, "workload": recipe.data["workload"], "threads": threads,
              "rounds": figures, "engines": engines}
    write(f"bench_peer-{Path(recipe.model).name}-{fingerprint['hardware']}", record)
    print(peer_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
