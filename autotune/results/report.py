"""`autotune report`: one self-contained HTML file (plotly.js inlined, works offline) that shows a study.

Figures: the Pareto front (throughput against TPOT p99, memory as marker size, and throughput against memory),
every trial's outcome, accuracy against speed per quantization scheme, parameter importances per objective, the
optimisation history; tables: the cost of the search and the recipes."""
from __future__ import annotations

import datetime as dt
import html
import math
import warnings
from pathlib import Path

import optuna

from autotune.errors import UserInputError
from autotune.recipes.baselines import study_baselines
from autotune.results.report_data import Point, is_simulated, points, recipe_rows, search_cost
from autotune.study.settings import study_objectives
from autotune.study.storage import load_existing_study

__all__ = ["build_report", "report"]

_STYLE = {  # outcome -> (legend name, colour, marker symbol)
    "front": ("Pareto front: feasible, gate passed, each one a recipe", "#1f77b4", "circle"),
    "dominated": ("dominated", "#b0b7c3", "circle-open"),
    "infeasible": ("over a constraint (memory budget, TPOT SLO, busy machine)", "#ff7f0e", "square-open"),
}
_MIN_IMPORTANCE_TRIALS = 5
_UNITS = {"throughput_tok_s": "tok/s", "tpot_p99_ms": "ms", "peak_memory_mb": "MB"}


def _size(memory_mb: float, lo: float, hi: float) -> float:
    # Marker area, not radius, grows with memory: 8 to 28 px across the study's range.
    return 8 + 20 * math.sqrt((memory_mb - lo) / (hi - lo)) if hi > lo else 14


def _hover(p: Point) -> str:
    b = p.bench or {}
    text = f"#{p.number} {p.label}<br>{p.outcome}"
    if b:
        text += (f"<br>{b['throughput_tok_s']:.1f} tok/s, TPOT p99 {b['tpot_p99_ms']:.2f} ms, "
                 f"{b['peak_memory_mb']:.0f} MB")
    if "tie_aware_agreement" in p.gate:
        text += f"<br>agreement {p.gate['tie_aware_agreement']:.4f}"
    return text + (f"<br>{html.escape(p.reason[:160])}" if p.reason else "")


def _pareto(study: optuna.Study, pts: list[Point], picks: dict[int, list[str]], x_metric: str, div: str):
    import plotly.graph_objects as go

    benched = [p for p in pts if p.bench]
    mems = [p.bench["peak_memory_mb"] for p in benched]
    lo, hi = (min(mems), max(mems)) if mems else (0.0, 0.0)
    fig = go.Figure()
    for outcome, (name, colour, symbol) in _STYLE.items():
        group = [p for p in benched if p.outcome == outcome]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[p.bench[x_metric] for p in group], y=[p.bench["throughput_tok_s"] for p in group], mode="markers+text",
            name=f"{name} ({len(group)})", hovertext=[_hover(p) for p in group], hoverinfo="text",
            text=[", ".join(picks.get(p.number, [])) for p in group], textposition="top center", cliponaxis=False,
            marker={"color": colour, "symbol": symbol, "line": {"width": 1.5, "color": colour},
                        "size": [_size(p.bench["peak_memory_mb"], lo, hi) for p in group]
                        if x_metric != "peak_memory_mb" else 11}))
    for base, colour in zip(study_baselines(study.user_attrs), ("#d62728", "#9467bd", "#8c564b")):
        b = base["bench"]
        fig.add_trace(go.Scatter(x=[b[x_metric]], y=[b["throughput_tok_s"]], mode="markers",
                                 name=f"speed baseline {'/'.join(base['names'])} ({base.get('dtype') or '?'})",
                                 hovertext=[f"baseline: {base.get('what', '')}<br>{b['throughput_tok_s']:.1f} tok/s"],
                                 hoverinfo="text", marker={"symbol": "star", "size": 18, "color": colour}))
    unbenched = sum(p.outcome in ("gated", "failed") for p in pts)
    fig.update_layout(
        title=f"Throughput against {x_metric} ({len(benched)} benchmarked trials; {unbenched} gated or failed, "
              "not benchmarked: see the outcomes below)", xaxis_title=f"{x_metric} ({_UNITS[x_metric]}), lower is better",
        yaxis_title="throughput (tok/s), higher is better", height=520, legend={"orientation": "h", "y": -0.2})
    return fig, div


def _outcomes(pts: list[Point]):
    import plotly.graph_objects as go

    colours = {"front": "#1f77b4", "dominated": "#b0b7c3", "infeasible": "#ff7f0e", "gated": "#9467bd",
               "failed": "#d62728", "running": "#7f7f7f"}
    fig = go.Figure()
    for outcome, colour in colours.items():
        group = [p for p in pts if p.outcome == outcome]
        if group:
            fig.add_trace(go.Scatter(x=[p.number for p in group], y=[outcome] * len(group), mode="markers",
                                     name=f"{outcome} ({len(group)})", hovertext=[_hover(p) for p in group],
                                     hoverinfo="text", marker={"color": colour, "size": 11, "symbol": "diamond"}))
    fig.update_layout(title="Every trial's outcome (hover for the configuration and the reason)",
                      xaxis_title="trial", height=300, showlegend=False)
    return fig


def _accuracy(study: optuna.Study, pts: list[Point]):
    import plotly.graph_objects as go

    fig = go.Figure()
    measured = [p for p in pts if "tie_aware_agreement" in p.gate]
    if not measured:  # a simulated study: no gate figures, so speed per scheme alone
        for quant in sorted({p.quant for p in pts if p.bench}):
            group = [p for p in pts if p.bench and p.quant == quant]
            fig.add_trace(go.Box(y=[p.bench["throughput_tok_s"] for p in group], name=quant, boxpoints="all"))
        fig.update_layout(title="Throughput per quantization scheme (accuracy not measured: simulated study)",
                          yaxis_title="throughput (tok/s)", height=420)
        return fig
    for quant in sorted({p.quant for p in measured}):
        group = [p for p in measured if p.quant == quant]
        fig.add_trace(go.Scatter(
            x=[p.gate["tie_aware_agreement"] for p in group],
            y=[p.bench["throughput_tok_s"] if p.bench else 0.0 for p in group], mode="markers", name=quant,
            hovertext=[_hover(p) for p in group], hoverinfo="text",
            marker={"size": 11, "symbol": ["x" if not p.bench else "circle" for p in group]}))
    fig.add_vline(x=study.user_attrs.get("min_agreement", 0.995), line_dash="dash",
                  annotation_text="gate", annotation_position="top left")
    fig.update_layout(title="Accuracy against speed per quantization scheme (x at 0 tok/s: gated, not benchmarked)",
                      xaxis_title="tie-aware agreement with the reference", yaxis_title="throughput (tok/s)",
                      height=460)
    return fig


def _importances(study: optuna.Study):
    import plotly.graph_objects as go

    fig, notes = go.Figure(), []
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < _MIN_IMPORTANCE_TRIALS:  # fANOVA answers even for one trial, but it means nothing there
        return None, f"Too few trials to rank the parameters ({len(done)} complete; needs {_MIN_IMPORTANCE_TRIALS})"
    for i, (name, _) in enumerate(study_objectives(study)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(study, target=lambda t, i=i: t.values[i])
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            notes.append(f"{name}: {exc}")
            continue
        fig.add_trace(go.Bar(x=list(imp.values()), y=list(imp.keys()), orientation="h", name=name))
    if not fig.data:
        return None, (f"Too few trials to rank the parameters ({len(done)} complete): " + "; ".join(notes))
    fig.update_layout(title="Parameter importance per objective (fANOVA)", barmode="group", height=420,
                      xaxis_title="importance")
    return fig, "; ".join(notes)


def _history(study: optuna.Study):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
    objectives = study_objectives(study)
    fig = make_subplots(rows=1, cols=len(objectives), subplot_titles=[n for n, _ in objectives])
    for i, (name, direction) in enumerate(objectives):
        xs, ys = [t.number for t in done], [t.values[i] for t in done]
        best, running = [], None
        for y in ys:
            running = y if running is None else (max if direction == "maximize" else min)(running, y)
            best.append(running)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=name, marker={"color": "#1f77b4"},
                                 showlegend=False), row=1, col=i + 1)
        fig.add_trace(go.Scatter(x=xs, y=best, mode="lines", line={"color": "#d62728", "shape": "hv"},
                                 name="best so far", showlegend=i == 0), row=1, col=i + 1)
    fig.update_layout(title="Optimisation history", height=380)
    return fig


def _table(rows: list[list[str]], head: list[str]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def _recipes_table(rows: list[dict]) -> str:
    if not rows:
        return "<p>No feasible, gate-passing trial: nothing to export.</p>"
    body = [[str(r["trial"]), html.escape(r["configuration"]), html.escape(", ".join(r["picks"]) or "-"),
             f"{r['throughput_tok_s']:.1f}", f"{r['gain']:.2f}x" if r["gain"] else "-", f"{r['tpot_p99_ms']:.2f}",
             f"{r['peak_memory_mb']:.0f}", "-" if r["agreement"] is None else f"{r['agreement']:.4f}",
             f"<code>{html.escape(r['recipe'])}</code>" + ("" if r["exported"] else " (not exported yet)")]
            for r in rows]
    return _table(body, ["trial", "configuration", "named pick", "tok/s", "gain", "TPOT p99 ms", "peak MB",
                         "agreement", "recipe"])


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.badge{display:inline-block;padding:4px 10px;border-radius:4px;color:#fff;font-weight:600}
.measured{background:#2ca02c}.simulated{background:#ff7f0e}code{font-size:90%}"""


def build_report(study: optuna.Study, recipes_out: str | Path = "recipes") -> str:
    """The report as one HTML document; plotly.js is inlined once, so it opens offline."""
    pts = points(study)
    rows = recipe_rows(study, recipes_out)
    picks = {r["trial"]: r["picks"] for r in rows}  # the named picks are labelled; every front point is a recipe
    attrs = study.user_attrs
    simulated = is_simulated(study)
    hardware = attrs.get("hardware", {})
    badge = ('<span class="badge simulated">SIMULATED: predicted by autotune\'s analytical model, not measured</span>'
             if simulated else '<span class="badge measured">MEASURED on this hardware</span>')
    parts = [f"<h1>Study {html.escape(study.study_name)}</h1>", badge,
             (f"<p>model <b>{html.escape(str(attrs.get('model', '?')))}</b>, backend "
             f"{html.escape(str(attrs.get('backend', '?')))}, hardware "
             f"{html.escape(str(hardware.get('hardware', hardware) if isinstance(hardware, dict) else hardware))}; "
             f"workload {html.escape(str(attrs.get('workload', {})))}; report made "
             f"{dt.datetime.now().isoformat(timespec='seconds')}</p>")]
    figures: list[tuple[str, object, str]] = []
    pareto, _ = _pareto(study, pts, picks, "tpot_p99_ms", "pareto")
    figures.append(("pareto", pareto, "Pareto front: throughput against TPOT p99 (marker size: peak memory)"))
    memory, _ = _pareto(study, pts, picks, "peak_memory_mb", "pareto-memory")
    figures.append(("pareto-memory", memory, "Throughput against peak memory"))
    figures.append(("outcomes", _outcomes(pts), "Trials: front, dominated, over a constraint, gated, failed"))
    figures.append(("accuracy", _accuracy(study, pts), "Accuracy against speed"))
    importance, note = _importances(study)
    figures.append(("importance", importance, "Which knob matters" + (f" <small>({html.escape(note)})</small>"
                                                                       if note else "")))
    figures.append(("history", _history(study), "Optimisation history"))
    first = True
    for div, fig, title in figures:
        parts.append(f"<h2>{title}</h2>")
        if fig is None:
            continue
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first, div_id=div,  # type: ignore[attr-defined]
                                 config={"displaylogo": False}))
        first = False
    cost = search_cost(study)
    parts += ["<h2>Cost of the search</h2>", _table([[html.escape(k), v] for k, v in cost.items()], ["", ""]),
              "<h2>Recipes</h2>", _recipes_table(rows)]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>autotune: {html.escape(study.study_name)}"
            f"</title><style>{_CSS}</style></head><body>{''.join(parts)}</body></html>")


def report(args) -> int:
    study, _ = load_existing_study(args.study, args.storage)
    if not study.trials:
        raise UserInputError(f"study {args.study!r} has no trials yet: run autotune search first")
    out = Path(args.out or f"studies/{args.study}.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_report(study, args.recipes), encoding="utf-8")
    print(f"report: {out} ({out.stat().st_size / 1e6:.1f} MB, opens offline)")
    return 0
