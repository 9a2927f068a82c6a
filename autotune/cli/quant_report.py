"""`autotune quant-report`: each quantization scheme x method x fallback depth through the accuracy gate."""
from __future__ import annotations

import argparse
import json

from autotune.cli.args import fraction
from autotune.config.deploy import DTYPES, FALLBACK_LAYERS, QUANT_METHODS, QUANT_SCHEMES
from autotune.errors import UserInputError
from autotune.probe.cpu import cpu_capabilities
from autotune.quant.report import format_table, measure_rows, report_configs

__all__ = ["register"]


def _choices(allowed: tuple):
    def parse(text: str) -> tuple:
        values = tuple(v for v in text.split(",") if v)
        if not values or any(v not in allowed for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: each must be one of {', '.join(map(str, allowed))}")
        return values
    return parse


def _depths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        values = ()
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated layer counts, 0 or more")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    methods = tuple(dict.fromkeys(m for ms in QUANT_METHODS.values() for m in ms))
    p = sub.add_parser("quant-report", help="each quantization scheme x method x fallback depth through the gate",
                       description="Build each scheme x method x fallback depth eagerly and gate it against the fp32 "
                                   "reference: tie-aware and raw agreement, decode agreement, perplexity, weights. "
                                   "The calibration and sensitivity it needs are computed once and cached.")
    p.add_argument("--model", default="smollm2-135m", help="registry name or Hugging Face folder")
    p.add_argument("--schemes", type=_choices(QUANT_SCHEMES), default=QUANT_SCHEMES, help="comma-separated")
    p.add_argument("--methods", type=_choices(methods), default=None, help="comma-separated (default: all)")
    p.add_argument("--fallback", type=_depths, default=FALLBACK_LAYERS,
                   help="comma-separated fallback depths (default: the search space's 0,1,2,4,8; deeper ones show "
                        "where a scheme would pass)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="the precision of what each scheme leaves unquantized (default: this CPU's fastest plain "
                        "precision, by its capability probe)")
    p.add_argument("--min-agreement", type=fraction, default=0.995)
    p.add_argument("--tie-epsilon", type=fraction, default=0.05)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", action="store_true", help="one JSON object per configuration instead of the table")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or cpu_capabilities().fastest
    configs = report_configs(args.schemes, args.methods, args.fallback, dtype)
    if not configs:
        raise UserInputError("no configuration: the methods given apply to none of the schemes given")
    rows = []
    for row in measure_rows(args.model, configs, tie_epsilon=args.tie_epsilon, min_agreement=args.min_agreement):
        rows.append(row)
        if args.json:
            print(json.dumps(row.to_dict()), flush=True)
    if not args.json:
        print(format_table(rows, args.min_agreement))
    return 0
