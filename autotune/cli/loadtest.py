"""`autotune loadtest URL`: real prompts (the shipped prompt text, decoded), rising concurrency, a table and JSON."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.cli.args import fraction, positive, slo_text, token_range
from autotune.config.slo import parse_slo
from autotune.errors import UserInputError
from autotune.gate.corpus import bench_prompts
from autotune.models.registry import resolve_model
from autotune.models.weights import load_tokenizer
from autotune.progress import log
from autotune.serve.loadtest import check_loopback, format_table, run_loadtest

__all__ = ["register", "loadtest", "parse_levels"]


def register(sub: argparse._SubParsersAction) -> None:
    lt = sub.add_parser("loadtest", help="client-side load test of a server (ours or OpenAI-compatible)")
    lt.add_argument("url", help="http://127.0.0.1:PORT (loopback only)")
    lt.add_argument("--concurrency", default="1,4,8,16,32", help="comma-separated levels (default 1,4,8,16,32)")
    lt.add_argument("--requests", type=positive(int), default=None,
                    help="requests per level (default max(16, 2 x concurrency))")
    lt.add_argument("--rate", type=positive(float), default=None,
                    help="requests/s: one open-loop level, each request sent at its arrival whatever is in flight and "
                         "timed from it (default: the concurrency levels, closed loop)")
    lt.add_argument("--arrival", choices=("poisson",), default="poisson",
                    help="how requests arrive at --rate: gamma gaps of shape --burstiness (1: Poisson)")
    lt.add_argument("--burstiness", type=positive(float), default=1.0,
                    help="the gamma shape of the gaps (below 1 burstier, above 1 more regular; default 1)")
    lt.add_argument("--slo", type=slo_text, default=None, metavar="ttft=1s,tpot=100ms",
                    help="latency objectives: each level's share of requests meeting both (a failed request misses)")
    lt.add_argument("--attainment", type=fraction, default=0.9, help="with --slo, the target share (default 0.9)")
    lt.add_argument("--find-goodput", action="store_true",
                    help="with --slo: the highest rate whose attainment meets the target, by a rate search of "
                         "open-loop runs (from --rate, or the rate a burst of --requests is served at)")
    lt.add_argument("--budget", type=positive(float), default=600.0,
                    help="seconds the goodput search may take (default 600)")
    lt.add_argument("--max-tokens", type=positive(int), default=64, help="output tokens per request (default 64)")
    lt.add_argument("--prompt-tokens", type=token_range, default=(112, 144), help="MIN:MAX prompt tokens")
    lt.add_argument("--tokenizer", default="smollm2-135m", help="model whose tokenizer cuts the prompts")
    lt.add_argument("--model-id", default=None, help="model field sent (default: the server's GET /v1/models)")
    lt.add_argument("--no-fixed-length", action="store_true",
                    help="do not send min_tokens/ignore_eos (servers that refuse vLLM's extensions)")
    lt.add_argument("--json", default=None, help="write the results here as JSON")
    lt.set_defaults(func=loadtest)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserInputError(f"--concurrency {text!r} is not a comma-separated list of integers") from None
    if not levels or min(levels) < 1:
        raise UserInputError(f"--concurrency {text!r} needs positive integers, e.g. 1,4,8,16,32")
    return levels


def _prompts(model: str, count: int, prompt_tokens: tuple[int, int]) -> list[str]:
    tokenizer = load_tokenizer(resolve_model(model))
    ids = bench_prompts(tokenizer, count, prompt_tokens[0], prompt_tokens[1], seed=0)
    return [tokenizer.decode(p, skip_special_tokens=True) for p in ids]


def loadtest(args) -> int:
    check_loopback(args.url)  # before loading anything
    levels = parse_levels(args.concurrency)
    log(f"loadtest: prompts from the shipped text, {args.prompt_tokens[0]}-{args.prompt_tokens[1]} tokens "
        f"({args.tokenizer} tokenizer)")
    prompts = _prompts(args.tokenizer, 64, args.prompt_tokens)
    slo = parse_slo(args.slo, args.attainment) if args.slo else None
    result = run_loadtest(args.url, prompts, levels, args.requests, args.max_tokens, model=args.model_id,
                          rate=args.rate, fixed_length=not args.no_fixed_length, burstiness=args.burstiness, slo=slo,
                          find_goodput=args.find_goodput, budget_s=args.budget)
    result["prompt_tokens"] = list(args.prompt_tokens)
    print(format_table(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"results: {args.json}")
    return 1 if any(level["errors"] for level in result["levels"]) else 0
