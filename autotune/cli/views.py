"""The subcommands that show a study: `show` (the Pareto table), `report` (one HTML file), `dashboard`."""
from __future__ import annotations

import argparse

from autotune.results.dashboard import dashboard
from autotune.results.report import report
from autotune.results.tables import pareto_table, study_summary
from autotune.study.storage import load_existing_study

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    sh = sub.add_parser("show", help="the Pareto table of a study, from its storage")
    sh.add_argument("--study", required=True)
    sh.add_argument("--storage", default=None)
    sh.set_defaults(func=_show)

    d = sub.add_parser("dashboard", help="optuna-dashboard on a study (notes and recipe files attached)")
    d.add_argument("--study", required=True)
    d.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    d.add_argument("--port", type=int, default=8080)
    d.add_argument("--artifacts", default=None, help="artifact folder (default: studies/artifacts beside the db)")
    d.add_argument("--recipes", default="recipes", help="where this study's recipes were exported (default recipes)")
    d.add_argument("--no-annotate", action="store_true", help="do not write notes or attach recipes first")
    d.set_defaults(func=dashboard)

    r = sub.add_parser("report", help="one self-contained HTML report of a study (plotly, opens offline)")
    r.add_argument("--study", required=True)
    r.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    r.add_argument("--out", default=None, help="HTML file (default studies/<study>.html)")
    r.add_argument("--recipes", default="recipes", help="where this study's recipes were exported (default recipes)")
    r.set_defaults(func=report)


def _show(args: argparse.Namespace) -> int:
    study, _ = load_existing_study(args.study, args.storage)
    print(study_summary(study))
    print(pareto_table(study))
    return 0
