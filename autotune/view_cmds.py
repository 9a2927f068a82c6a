"""The subcommands that show a study (dashboard, report): their arguments and their dispatch."""
from __future__ import annotations

import argparse

__all__ = ["COMMANDS", "add_parsers", "run_command"]

COMMANDS = ("dashboard", "report")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboard", help="optuna-dashboard on a study (notes and recipe files attached)")
    d.add_argument("--study", required=True)
    d.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    d.add_argument("--port", type=int, default=8080)
    d.add_argument("--artifacts", default=None, help="artifact folder (default: studies/artifacts beside the db)")
    d.add_argument("--recipes", default="recipes", help="where this study's recipes were exported (default recipes)")
    d.add_argument("--no-annotate", action="store_true", help="do not write notes or attach recipes first")

    r = sub.add_parser("report", help="one self-contained HTML report of a study (plotly, opens offline)")
    r.add_argument("--study", required=True)
    r.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    r.add_argument("--out", default=None, help="HTML file (default studies/<study>.html)")
    r.add_argument("--recipes", default="recipes", help="where this study's recipes were exported (default recipes)")


def run_command(args: argparse.Namespace) -> int:
    if args.command == "dashboard":
        from autotune.dashboard import dashboard

        return dashboard(args)
    from autotune.report import report

    return report(args)
