"""`autotune loadtest URL`: real prompts (the shipped prompt text, decoded), rising concurrency, a table and JSON."""
from __future__ import annotations

import json
from pathlib import Path

from autotune.errors import UserInputError
from autotune.loadtest import check_loopback, format_table, run_loadtest
from autotune.progress import log

__all__ = ["loadtest", "parse_levels"]


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserInputError(f"--concurrency {text!r} is not a comma-separated list of integers") from None
    if not levels or min(levels) < 1:
        raise UserInputError(f"--concurrency {text!r} needs positive integers, e.g. 1,4,8,16,32")
    return levels


def _prompts(model: str, count: int, prompt_tokens: tuple[int, int]) -> list[str]:
    from autotune.corpus import bench_prompts
    from autotune.models import resolve_model
    from autotune.weights import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(model))
    ids = bench_prompts(tokenizer, count, prompt_tokens[0], prompt_tokens[1], seed=0)
    return [tokenizer.decode(p, skip_special_tokens=True) for p in ids]


def loadtest(args) -> int:
    check_loopback(args.url)  # before loading anything
    levels = parse_levels(args.concurrency)
    log(f"loadtest: prompts from the shipped text, {args.prompt_tokens[0]}-{args.prompt_tokens[1]} tokens "
        f"({args.tokenizer} tokenizer)")
    prompts = _prompts(args.tokenizer, 64, args.prompt_tokens)
    result = run_loadtest(args.url, prompts, levels, args.requests, args.max_tokens, model=args.model_id,
                          rate=args.rate, fixed_length=not args.no_fixed_length)
    result["prompt_tokens"] = list(args.prompt_tokens)
    print(format_table(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"results: {args.json}")
    return 1 if any(level["errors"] for level in result["levels"]) else 0
