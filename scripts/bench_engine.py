"""The engine's offline speed, two code trees side by side: `Runner.run` of one workload, each tree in a fresh process,
alternating, medians; and whether both produced the same tokens.

    python scripts/bench_engine.py TREE_A TREE_B [--model smollm2-135m] [--rounds 5] [--dtype fp32] [--fusion O0]
        [--batch 8] [--requests 16] [--prompt-min 112] [--prompt-max 144] [--new 64] [--tiny]

Each tree is a checkout of this repository (its root, put first on PYTHONPATH in the child process). A child builds
the engine, runs the workload once untimed (eager kernels warm, compiled graphs built), then times one run and
prints its seconds and a digest of the output tokens. Rounds alternate which tree goes first, since this machine's
speed drifts within minutes. `--tiny`: a random peaked tiny LLaMA (SmolLM2's vocabulary, random prompt ids), for a
smoke check in seconds. Greedy outputs must match: the digests are compared."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _tiny_model_and_prompts(args: argparse.Namespace):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.prompt_min, args.prompt_max + 1, (args.requests,), generator=g).tolist()
    return model, [torch.randint(3, config.vocab_size, (n,), generator=g).tolist() for n in lengths], None


def _model_and_prompts(args: argparse.Namespace):
    from autotune.gate.corpus import bench_prompts
    from autotune.models.registry import resolve_model
    from autotune.models.weights import load_hf_model, load_tokenizer

    spec = resolve_model(args.model)
    tokenizer = load_tokenizer(spec)
    prompts = bench_prompts(tokenizer, args.requests, args.prompt_min, args.prompt_max, 0)
    return load_hf_model(spec, "float32"), prompts, tokenizer.eos_token_id


def child(args: argparse.Namespace) -> None:
    """One tree's measurement: prints one JSON line."""
    from autotune.config.deploy import DeployConfig
    from autotune.engine import Request, build_engine

    model, prompts, eos = _tiny_model_and_prompts(args) if args.tiny else _model_and_prompts(args)
    split = 0 if args.fusion != "O0" else None
    engine = build_engine(model, DeployConfig(dtype=args.dtype, fusion_level=args.fusion, layers_per_subgraph=split,
                                              batch_size=args.batch))
    max_seq_len = args.prompt_max + args.new
    runner = engine.runner(max_seq_len=max_seq_len, pool_tokens=args.batch * max_seq_len)

    def requests() -> list:
        return [Request(p, args.new, min_new_tokens=args.new, eos_token_id=eos) for p in prompts]

    runner.run(requests())
    started = time.perf_counter()
    outs = runner.run(requests())
    seconds = time.perf_counter() - started
    digest = hashlib.sha256(json.dumps([o.output_ids for o in outs]).encode()).hexdigest()[:16]
    print(json.dumps({"seconds": seconds, "tokens": sum(len(o.output_ids) for o in outs), "digest": digest}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--fusion", default="O0")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-min", type=int, default=112)
    parser.add_argument("--prompt-max", type=int, default=144)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    if len(args.trees) != 2:
        parser.error("give two code trees")
    trees = [os.path.abspath(t) for t in args.trees]
    passed = [a for a in sys.argv[1:] if a not in args.trees]
    seconds: dict[str, list[float]] = {t: [] for t in trees}
    digests: dict[str, set[str]] = {t: set() for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run([sys.executable, __file__, "--child", *passed], env=env, check=True,
                                 capture_output=True, text=True).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            seconds[tree].append(figures["seconds"])
            digests[tree].add(figures["digest"])
            print(f"round {r + 1} {tree}: {figures['seconds']:.3f} s, {figures['tokens'] / figures['seconds']:.1f} "
                  f"tok/s, tokens {figures['digest']}", flush=True)
    medians = {t: statistics.median(s) for t, s in seconds.items()}
    for tree in trees:
        print(f"{tree}: median {medians[tree]:.3f} s over {args.rounds} (min {min(seconds[tree]):.3f}, "
              f"max {max(seconds[tree]):.3f})")
    print(f"B / A time: {medians[trees[1]] / medians[trees[0]]:.3f}")
    same = len(digests[trees[0]] | digests[trees[1]]) == 1
    print("outputs: identical" if same else f"outputs DIFFER: {digests}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
