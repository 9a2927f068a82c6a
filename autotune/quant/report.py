"""The quantization report: every scheme x method x fallback depth built eagerly and run through the accuracy gate
against the fp32 reference, with the weights' size. Which calibrated configuration passes, and at what depth."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from autotune.config.deploy import FALLBACK_LAYERS, QUANT_METHODS, QUANT_SCHEMES, DeployConfig
from autotune.engine import build_engine
from autotune.engine.quant import weight_bytes
from autotune.errors import AutotuneError
from autotune.gate.accuracy import GateResult, Reference, compute_reference, evaluate_gate
from autotune.gate.cache import reference_path
from autotune.gate.corpus import EVAL_POSITIONS, drift_prompts, eval_set_digest, eval_windows
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.quant.plan import quant_plan

__all__ = ["Row", "format_table", "measure_rows", "passing_depth", "report_configs"]


@dataclass(slots=True)
class Row:
    scheme: str
    method: str
    fallback_layers: int
    tie_aware_agreement: float | None = None
    raw_agreement: float | None = None
    perplexity: float | None = None
    reference_perplexity: float | None = None
    decode_agreement: float | None = None
    passed: bool = False
    weight_mb: float | None = None
    kept_layers: tuple[str, ...] = ()
    error: str | None = None
    seconds: float = 0.0
    dtype: str = "bf16"

    def to_dict(self) -> dict:
        return asdict(self)


def report_configs(schemes: tuple[str, ...] = QUANT_SCHEMES, methods: tuple[str, ...] | None = None,
                   fallbacks: tuple[int, ...] = FALLBACK_LAYERS, dtype: str = "bf16") -> list[DeployConfig]:
    """Eager (O0) configurations of every meaningful scheme x method x fallback depth, in `dtype` (quant none:
    one, no fallback)."""
    out = []
    for scheme in schemes:
        for method in QUANT_METHODS[scheme]:
            if methods is not None and method not in methods:
                continue
            for fallback in (0,) if scheme == "none" else fallbacks:
                out.append(DeployConfig(quant=scheme, quant_method=method, fallback_layers=fallback, dtype=dtype))
    return out


def _reference(hf, spec, tokenizer, positions: int) -> Reference:
    """The cached fp32 reference (as a study computes it), computed here when missing."""
    path = reference_path(model_checksum(spec), eval_set_digest(positions))
    if not path.is_file():
        log("quant-report: computing the fp32 reference (once per model)")
        ref = compute_reference(hf, eval_windows(tokenizer, positions), drift_prompts(tokenizer), 128)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(asdict(ref), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
    return Reference(**torch.load(path))


def measure_rows(model: str, configs: list[DeployConfig], *, tie_epsilon: float = 0.05,
                 min_agreement: float = 0.995, positions: int = EVAL_POSITIONS) -> Iterator[Row]:
    """One Row per configuration, gated as a trial gates (teacher-forced windows, then the decode path), never
    stopped early: a failing configuration's full figures are reported too."""
    spec = resolve_model(model)
    tokenizer = load_tokenizer(spec)
    hf = load_hf_model(spec, "float32")
    reference = _reference(hf, spec, tokenizer, positions)
    windows, prompts = eval_windows(tokenizer, positions), drift_prompts(tokenizer)
    for config in configs:
        started = time.perf_counter()
        row = Row(config.quant, config.quant_method, config.fallback_layers, dtype=config.dtype)
        log(f"quant-report: {config.scheme_label()}")
        try:
            plan = quant_plan(hf, spec, tokenizer, config)
            engine = build_engine(hf, config, plan=plan)
            figures = evaluate_gate(engine, reference, windows, prompts, tie_epsilon=tie_epsilon, min_agreement=0.0,
                                    max_seq_len=256).to_dict()
        except AutotuneError as exc:
            row.error, row.seconds = str(exc), time.perf_counter() - started
            yield row
            continue
        gate = GateResult.from_dict({**figures, "min_agreement": min_agreement})
        row.tie_aware_agreement, row.raw_agreement = gate.tie_aware_agreement, gate.raw_agreement
        row.perplexity, row.reference_perplexity = gate.perplexity, gate.reference_perplexity
        row.decode_agreement, row.passed = gate.decode_agreement, gate.passed
        row.weight_mb = weight_bytes(engine.model) / 2**20
        row.kept_layers = plan.keep if plan else ()
        row.seconds = time.perf_counter() - started
        del engine
        yield row


def passing_depth(rows: list[Row]) -> dict[tuple[str, str], int | None]:
    """(scheme, method) -> the smallest fallback depth that passes the gate (None: none measured passes)."""
    out: dict[tuple[str, str], int | None] = {}
    for row in sorted(rows, key=lambda r: r.fallback_layers):
        key = (row.scheme, row.method)
        out.setdefault(key, None)
        if row.passed and out[key] is None:
            out[key] = row.fallback_layers
    return out


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[Row], min_agreement: float = 0.995) -> str:
    """A Markdown table, then the depth at which each scheme and method passes."""
    lines = ["| scheme | dtype | method | fallback | tie-aware | raw | decode | perplexity | weights MB | gate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = f"error: {r.error}" if r.error else ("pass" if r.passed else "FAIL")
        lines.append(f"| {r.scheme} | {r.dtype} | {r.method} | {r.fallback_layers} | "
                     f"{_f(r.tie_aware_agreement, '.4f')} | "
                     f"{_f(r.raw_agreement, '.4f')} | {_f(r.decode_agreement, '.4f')} | {_f(r.perplexity, '.2f')} | "
                     f"{_f(r.weight_mb, '.1f')} | {verdict} |")
    if rows and rows[0].reference_perplexity is not None:
        lines.append(f"\nreference (fp32) perplexity {rows[0].reference_perplexity:.2f}; gate: tie-aware and decode "
                     f"agreement > {min_agreement}")
    for (scheme, method), depth in passing_depth(rows).items():
        if scheme != "none":
            where = f"passes from fallback {depth}" if depth is not None else "passes at no measured fallback depth"
            lines.append(f"{scheme}/{method}: {where}")
    return "\n".join(lines)
