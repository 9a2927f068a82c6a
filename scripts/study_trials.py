"""A study's trials, in order, as the docs quote them: each trial's role, configuration, outcome (its throughput,
the gate's reason, or why it did not run) and its wall time beside the cost model's prediction.

    python scripts/study_trials.py --storage sqlite:///xeon.db --study bench-xeon-cold --name smollm2-xeon

Writes docs/data/trials-NAME.json (bench_record.py: the commit, this command, the study's machine) from the study's
own records; tests/test_docs_tables.py renders its table (bench_tables.trials_table) and checks the page that
quotes it."""
from __future__ import annotations

import argparse
import os
import sys

import optuna

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import machine, write  # noqa: E402
from bench_tables import trials_table  # noqa: E402


def _trial(t: optuna.trial.FrozenTrial) -> dict:
    a = t.user_attrs
    cost = a.get("trial_cost") or {}
    row = {"number": t.number, "state": t.state.name, "role": a.get("role", "-"), "label": a.get("label"),
           "took_s": cost.get("actual_s", a.get("trial_seconds")), "predicted_s": cost.get("expected_s")}
    if "bench" in a:
        row["throughput_tok_s"] = a["bench"]["throughput_tok_s"]
    goodput = a.get("goodput")
    if goodput and "goodput_req_s" in goodput:  # a study under latency objectives: the goodput and its search's time
        row["goodput_req_s"] = goodput["goodput_req_s"]
        row["goodput_search_s"] = goodput.get("seconds")
    if a.get("reason"):
        row["reason"] = a["reason"]
    if "duplicate_of" in a:
        row["duplicate_of"] = a["duplicate_of"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--name", required=True, help="docs/data/trials-NAME.json")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    record = {"kind": "trials", "study": args.study, "machine": machine(study.user_attrs["hardware"]),
              "stopped_by": study.user_attrs.get("stopped_by"), "rounds": [_trial(t) for t in study.trials]}
    write(f"trials-{args.name}", record)
    print(trials_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
