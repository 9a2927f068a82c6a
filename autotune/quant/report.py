"""The quantization report: every scheme x method x fallback depth built eagerly and run through the accuracy gate
against the fp32 reference, with the weights' size. Which calibrated configuration passes, and at what depth."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from autotune.config.deploy import FALLBACK_LAYERS, QUANT_METHODS, QUANT_SCHEMES, DeployConfig
from autotune.engine import build_engine
from autotune.engine.quant import weight_bytes
from autotune.errors import AutotuneError
from autotune.gate.accuracy import GateResult, evaluate_gate
from autotune.gate.corpus import EVAL_POSITIONS, decode_prompts, eval_windows
from autotune.gate.reference import cached_reference
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
    tie_aware_interval: list[float] | None = None  # 95% Clopper-Pearson, as the gate states its verdicts
    decode_interval: list[float] | None = None
    decode_positions: int = 0
    decode_verdict: str | None = None
    decode_decided: bool | None = None

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


def measure_rows(model: str, configs: list[DeployConfig], *, tie_epsilon: float = 0.05,
                 min_agreement: float = 0.995, positions: int = EVAL_POSITIONS) -> Iterator[Row]:
    """One Row per configuration, gated as a trial gates (teacher-forced windows, then the decode path), never
    stopped early: a failing configuration's full figures are reported too."""
    spec = resolve_model(model)
    tokenizer = load_tokenizer(spec)
    hf = load_hf_model(spec, "float32")
    log("quant-report: the fp32 reference (computed once per model, then cached)")
    reference = cached_reference(model_checksum(spec), tokenizer, positions, lambda: hf)
    windows, prompts = eval_windows(tokenizer, positions), decode_prompts(tokenizer, eval_positions=positions)
    for config in configs:
        started = time.perf_counter()
        row = Row(config.quant, config.quant_method, config.fallback_layers, dtype=config.dtype)
        log(f"quant-report: {config.scheme_label()}")
        try:
            plan = quant_plan(hf, spec, tokenizer, config)
            engine = build_engine(hf, config, plan=plan)
            figures = evaluate_gate(engine, reference, windows, prompts, tie_epsilon=tie_epsilon,
                                    min_agreement=min_agreement, max_seq_len=256, stop_early=False).to_dict()
        except AutotuneError as exc:
            row.error, row.seconds = str(exc), time.perf_counter() - started
            yield row
            continue
        gate = GateResult.from_dict(figures)
        row.tie_aware_agreement, row.raw_agreement = gate.tie_aware_agreement, gate.raw_agreement
        row.perplexity, row.reference_perplexity = gate.perplexity, gate.reference_perplexity
        row.decode_agreement, row.passed = gate.decode_agreement, gate.passed
        row.tie_aware_interval, row.decode_interval = gate.tie_aware_interval, gate.decode_interval
        row.decode_positions, row.decode_verdict = gate.decode_positions, gate.decode_verdict
        row.decode_decided = gate.decode_decided
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


def _interval(bounds: list[float] | None) -> str:
    return "-" if bounds is None else f"{bounds[0]:.4f}-{bounds[1]:.4f}"


def format_table(rows: list[Row], min_agreement: float = 0.995) -> str:
    """A Markdown table, then the depth at which each scheme and method passes."""
    lines = ["| scheme | dtype | method | fallback | tie-aware (95% interval) | raw | decode (95% interval, positions) "
             "| perplexity | weights MB | gate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = f"error: {r.error}" if r.error else ("pass" if r.passed else "FAIL")
        if r.decode_decided is False:
            verdict += " (by the point estimate: the decode interval straddles the threshold at the cap)"
        decode = _f(r.decode_agreement, '.4f')
        if r.decode_agreement is not None:
            decode += f" ({_interval(r.decode_interval)}, {r.decode_positions})"
        lines.append(f"| {r.scheme} | {r.dtype} | {r.method} | {r.fallback_layers} | "
                     f"{_f(r.tie_aware_agreement, '.4f')} ({_interval(r.tie_aware_interval)}) | "
                     f"{_f(r.raw_agreement, '.4f')} | {decode} | {_f(r.perplexity, '.2f')} | "
                     f"{_f(r.weight_mb, '.1f')} | {verdict} |")
    if rows and rows[0].reference_perplexity is not None:
        lines.append(f"\nreference (fp32) perplexity {rows[0].reference_perplexity:.2f}; gate: tie-aware and decode "
                     f"agreement > {min_agreement}")
    for (scheme, method), depth in passing_depth(rows).items():
        if scheme != "none":
            where = f"passes from fallback {depth}" if depth is not None else "passes at no measured fallback depth"
            lines.append(f"{scheme}/{method}: {where}")
    return "\n".join(lines)
