"""Does a correct build pass the decode check with a margin at every batch and page size? Runs the gate's decode
check (autotune/gate/decode.py: stages of 48 prompts, up to 192, verdicts by their 95% Clopper-Pearson interval)
on plain builds of each precision over a grid of batch and page sizes, against the cached fp32 reference, and
prints one row each: agreement, misses, positions, prompts used, the interval and the verdict.

    python scripts/decode_margin.py [--model smollm2-135m] [--dtypes bf16,fp32] [--batch 1,8,16] [--page 16,256]

The cache shapes are the default workload's (as a trial's gate uses them). Print the CPU beside the table: the
kernels, and so the rounding, differ between ISA levels."""
from __future__ import annotations

import argparse
import itertools
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.engine import build_engine  # noqa: E402
from autotune.gate.corpus import EVAL_POSITIONS, decode_prompts  # noqa: E402
from autotune.gate.decode import decode_check  # noqa: E402
from autotune.gate.reference import cached_reference  # noqa: E402
from autotune.host import cpu_model, isa_level  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--batch", type=_ints, default=[1, 8, 16])
    parser.add_argument("--page", type=_ints, default=[16, 256])
    parser.add_argument("--policy", default="on_demand")
    parser.add_argument("--min-agreement", type=float, default=0.995)
    args = parser.parse_args()
    spec = resolve_model(args.model)
    tokenizer = load_tokenizer(spec)
    hf = load_hf_model(spec, "float32")
    reference = cached_reference(model_checksum(spec), tokenizer, EVAL_POSITIONS, lambda: hf)
    prompts = decode_prompts(tokenizer)
    max_seq_len = Workload().max_seq_len
    print(f"machine: {cpu_model()}, ISA level {isa_level()}; model {spec.name}; threshold {args.min_agreement}")
    print("| dtype | batch | page | decode agreement | misses / positions | prompts | 95% interval | verdict | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype, batch, page in itertools.product(args.dtypes.split(","), args.batch, args.page):
        engine = build_engine(hf, DeployConfig(dtype=dtype, batch_size=batch, page_size=page, kv_policy=args.policy))
        started = time.perf_counter()
        d = decode_check(engine, reference, prompts, 0.05, args.min_agreement, max_seq_len, batch * max_seq_len)
        misses = round((1 - d["decode_agreement"]) * d["decode_positions"])
        low, high = d["decode_interval"]
        verdict = ("pass" if d["decode_passed"] else "FAIL") + ("" if d["decode_decided"] else " (point estimate)")
        print(f"| {dtype} | {batch} | {page} | {d['decode_agreement']:.4f} | {misses} / {d['decode_positions']} | "
              f"{d['decode_prompts']} | [{low:.4f}, {high:.4f}] | {verdict} | {time.perf_counter() - started:.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
