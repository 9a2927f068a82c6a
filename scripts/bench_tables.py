"""The markdown tables the docs quote, rendered from the benchmark records under docs/data/ alone: each script
prints its table from the record it has just written, and tests/test_docs_tables.py renders every record a page
marks (`<!-- data: docs/data/NAME.json -->` on the line before a table) and checks that the page holds exactly
that. A figure in those tables is therefore never copied by hand.

Orders ("faster", "lower") are stated only where no round of one overlaps a round of the other (bench_record.
compare); otherwise "within noise"."""
from __future__ import annotations

import statistics

__all__ = ["render", "header", "search_block", "search_table", "search_summary", "serve_table", "peer_table",
           "startup_table", "trials_table", "guide_table", "profile_table", "goodput_table", "decode_batch_table"]


def _range(s: dict, fmt: str = ".1f") -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def _median(runs: list[dict], key: str, sub: str | None = None) -> float:
    return statistics.median(r[key][sub] if sub else r[key] for r in runs)


def _order(word: str, better: str, worse: str) -> str:
    return {"higher": better, "lower": worse}.get(word, "within noise")


def search_table(record: dict) -> str:
    """bench_search.py's side-by-side rounds: each baseline and the best found, medians (throughput with its
    range), and the best's ratio to each baseline with the order its rounds allow."""
    labels = [b["label"] for b in record["baselines"]]
    names = {b["label"]: f"transformers `generate` {b['dtype']}, batch {b['batch_size']}" for b in record["baselines"]}
    head = ["figure", *(names[label] for label in labels), f"best found: {record['best']['label']}",
            *(f"best / {names[label].removeprefix('transformers `generate` ')}" for label in labels)]
    rows = [head, ["---"] * len(head)]
    tput = record["throughput"]
    rows.append(["throughput (tok/s), median (range)", *(_range(tput[label]) for label in labels),
                 _range(tput["candidate"]),
                 *(f"**{record['ratios'][label]:.2f}x** {_order(record['order'][label], 'faster', 'slower')}"
                   for label in labels)])
    for key, name, fmt in (("ttft_p50_ms", "TTFT p50 (ms), median", ".0f"), ("tpot_p50_ms", "TPOT p50 (ms), median",
                                                                            ".1f"),
                           ("peak_memory_mb", "peak memory (MB), median", ".0f")):
        best = _median(record["rounds"]["candidate"], key)
        base = [_median(record["rounds"][label], key) for label in labels]
        rows.append([name, *(f"{b:{fmt}}" for b in base), f"{best:{fmt}}", *(f"{best / b:.2f}x" for b in base)])
    return _markdown(rows)


def search_summary(record: dict) -> str:
    """How the search behind a bench_search record spent its budget, in one line."""
    s = record["search"]
    stop = s["stopped_by"]
    used = f"{stop['used_s']:.0f} of {stop['budget_s']:.0f} s" if stop.get("used_s") is not None else "-"
    return (f"search: {used} used; stopped by {stop['rule']}: {stop['reason']}; {s['trials']} trials, "
            f"{s['not_run']} picks not run, {s['repeats_skipped']} repeats; fusion levels "
            f"{', '.join(s['fusion_levels'])}; quantization {', '.join(s['quant_schemes'])}")


def serve_table(record: dict) -> str:
    """bench_serve.py: the offline benchmark and the served run of one recipe, each version, side by side."""
    rows = [["version", "offline tok/s, median (range)", "served tok/s, median (range)", "served / offline",
             "ratio per round", "TPOT p50 offline / served (ms)", "served against offline"], ["---"] * 7]
    for name, v in record["versions"].items():
        rows.append([f"{name} ({v['tree']})", _range(v["offline"]), _range(v["served"]), f"**{v['ratio']:.2f}**",
                     ", ".join(f"{r:.2f}" for r in v["round_ratios"]),
                     f"{v['tpot_p50_ms']['offline']:.1f} / {v['tpot_p50_ms']['served']:.1f}",
                     _order(v["order"], "higher", "lower")])
    table = _markdown(rows)
    if record.get("loadtest"):
        table += "\n\n" + _loadtest(record["loadtest"])
    return table


def _loadtest(levels: list[dict]) -> str:
    rows = [["concurrency", "requests", "tok/s", "TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms", "errors"],
            ["---"] * 7]
    rows += [[str(lv["concurrency"]), str(lv["requests"]), f"{lv['throughput_tok_s']:.1f}",
              f"{lv['ttft_ms']['p50']:.0f}", f"{lv['tpot_ms']['p50']:.1f}", f"{lv['tpot_ms']['p99']:.1f}",
              str(lv["errors"])] for lv in levels]
    return _markdown(rows)


def peer_table(record: dict) -> str:
    """bench_peer.py: our recipe and the peer engines' configurations, each engine in its own process, medians."""
    ours = record["engines"].get("ours")
    rows = [["engine", "configuration", "tok/s, median (range)", "TTFT p50 ms", "TPOT p50 ms", "peak MB",
             "ours / this", "ours against this", "gate (tie-aware / decode)"], ["---"] * 9]
    for name, e in record["engines"].items():
        gate = e.get("gate")
        gate_text = (f"{gate['tie_aware_agreement']:.4f} / {gate['decode_agreement'] or 0:.4f} "
                     f"{'pass' if gate['passed'] else 'FAIL'}" if gate else "-")
        rows.append([name, e["configuration"], _range(e["throughput"]), f"{_median(e['runs'], 'ttft_p50_ms'):.0f}",
                     f"{_median(e['runs'], 'tpot_p50_ms'):.1f}", f"{_median(e['runs'], 'peak_memory_mb'):.0f}",
                     "-" if ours is None or name == "ours" else f"{e['ours_ratio']:.2f}x",
                     "-" if ours is None or name == "ours" else _order(e["order"], "faster", "slower"), gate_text])
    return _markdown(rows)


def profile_table(record: dict) -> str:
    """profile_step.py: an offline run's phases in our engine and OpenVINO's, medians of the rounds, and what ours
    spends more in each."""
    ours, peer = record["engines"]["ours"], record["engines"]["openvino"]

    def med(e: dict, key: str) -> float:
        return statistics.median(r[key] for r in e["runs"])

    rows = [["figure (median of rounds)", "ours", "OpenVINO defaults", "ours - OpenVINO"], ["---"] * 4,
            ["tok/s (range)", _range(ours["throughput"]), _range(peer["throughput"]),
             f"{peer['ours_ratio']:.2f}x, " + _order(peer["order"], "faster", "slower")]]
    for label, key, scale, fmt in (("run, ms", "wall_s", 1e3, ".0f"), ("prefill phase, ms", "prefill_s", 1e3, ".0f"),
                                   ("prefill forwards or steps", "prefill_forwards", 1, ".0f"),
                                   ("prompt tokens computed (padding included)", "computed_tokens", 1, ".0f"),
                                   ("output tokens made while prefilling", "prefill_output_tokens", 1, ".0f"),
                                   ("decode phase, ms", "decode_s", 1e3, ".0f"),
                                   ("decode steps", "decode_steps", 1, ".0f"),
                                   (f"decode step at {record['batch']} rows, ms", "decode_step_ms_full", 1, ".1f"),
                                   ("the rest (sampling, inputs, scheduling), ms", "rest_s", 1e3, ".0f")):
        a, b = med(ours, key) * scale, med(peer, key) * scale
        rows.append([label, format(a, fmt), format(b, fmt), format(a - b, "+" + fmt)])
    return _markdown(rows)


def startup_table(record: dict) -> str:
    """bench_startup.py: `autotune serve` from launch to its first answer to /health, per kind of start."""
    rows = [["start", "what it does", "seconds to ready, median (range)", "rounds (s)"], ["---"] * 4]
    for kind in record["kinds"]:
        s = record["seconds"][kind["name"]]
        rows.append([kind["name"], kind["what"], _range(s), ", ".join(f"{x:.1f}" for x in s["rounds"])])
    return _markdown(rows)


def trials_table(record: dict) -> str:
    """study_trials.py: a study's trials in order, each one's outcome and wall time against its prediction."""
    rows = [["trial", "chosen by", "configuration", "outcome", "took s (predicted)"], ["---"] * 5]
    for t in record["rounds"]:
        if "goodput_req_s" in t:
            outcome = (f"goodput {t['goodput_req_s']:.2f} req/s (its search {t['goodput_search_s']:.0f} s), "
                       f"{t['throughput_tok_s']:.1f} tok/s")
        elif "throughput_tok_s" in t:
            outcome = f"{t['throughput_tok_s']:.1f} tok/s"
        elif "duplicate_of" in t:
            outcome = f"repeat of trial {t['duplicate_of']}"
        else:  # a failure's reason may carry its tool's output: its first line is the table's
            outcome = (t.get("reason") or t["state"].lower()).splitlines()[0]
        took = "-" if t.get("took_s") is None else f"{t['took_s']:.0f}" + (
            "" if t.get("predicted_s") is None else f" ({t['predicted_s']:.0f})")
        rows.append([str(t["number"]), t["role"], t.get("label") or "-", outcome, took])
    return _markdown(rows)


def guide_table(record: dict) -> str:
    """bench_guide.py: guided against unguided searches of the default space on synthetic machines, per seed; the
    medians and ranges of each arm, and in how many seeds the guided one found the larger hypervolume."""
    rows = [["arm", "trials", "hypervolume share, median [min, max]", "best throughput share, median [min, max]"],
            ["---"] * 4]
    runs = record["rounds"]
    for n in record["at"]:
        for arm in ("guided", "unguided"):
            mine = [r for r in runs if r["arm"] == arm and r["trials"] == n]
            hv, top = [r["hypervolume_share"] for r in mine], [r["best_throughput_share"] for r in mine]
            rows.append([arm, str(n), f"{statistics.median(hv):.3f} [{min(hv):.3f}, {max(hv):.3f}]",
                         f"{statistics.median(top):.3f} [{min(top):.3f}, {max(top):.3f}]"])
    lines = []
    for n in record["at"]:
        by_seed = {(r["seed"], r["arm"]): r["hypervolume_share"] for r in runs if r["trials"] == n}
        seeds = sorted({seed for seed, _ in by_seed})
        wins = sum(by_seed[(s, "guided")] > by_seed[(s, "unguided")] for s in seeds)
        lines.append(f"at {n} trials the guided search found the larger hypervolume in {wins} of {len(seeds)} seeds")
    return _markdown(rows) + "\n\n" + "; ".join(lines)


def goodput_table(record: dict) -> str:
    """bench_goodput.py: each recipe's goodput as served (HTTP, its rounds), the trial's beside it, and the first
    recipe's ratio to each other one."""
    slo = record["slo"]
    first = record["first"]
    rows = [["recipe", "configuration", f"served goodput req/s (TTFT <= {slo['ttft_ms']:g} ms, TPOT <= "
             f"{slo['tpot_ms']:g} ms, {slo['attainment']:.0%}), median (range)", "output tok/s", "trial's req/s",
             "served / trial", f"{first} / this", f"{first} against this"], ["---"] * 8]
    for name, e in record["recipes"].items():
        trial = e.get("trial_goodput_req_s")
        served = e["goodput_req_s"]["median"]
        rows.append([name, e["configuration"], _range(e["goodput_req_s"], ".2f"), f"{e['goodput_tok_s']['median']:.1f}",
                     "-" if trial is None else f"{trial:.2f}", "-" if not trial else f"{served / trial:.2f}",
                     "-" if name == first or e.get("first_ratio") is None else f"{e['first_ratio']:.2f}x",
                     "-" if name == first else _order(e["order"], "higher", "lower")])
    return _markdown(rows)


def decode_batch_table(record: dict) -> str:
    """bench_decode_batch.py: the O2 decode step from a package per batch bucket against one for every batch."""
    rows = [["packages", "decode step at the full batch, ms, median (range)", "run s, median (range)",
             "compile s (all the arm's packages)", "this / static"], ["---"] * 5]
    static = record["arms"]["static"]["decode_step_ms"]["median"]
    what = {"static": "one per batch bucket (static batch)", "dynamic": "one for every batch of 2 rows or more"}
    for name, arm in record["arms"].items():
        ratio = "-" if name == "static" else (f"{arm['decode_step_ms']['median'] / static:.3f}x, "
                                              f"{_order(record['order'], 'slower', 'faster')}")
        rows.append([what[name], _range(arm["decode_step_ms"], ".2f"), _range(arm["run_s"], ".3f"),
                     f"{arm['compile_s']:.1f}", ratio])
    return _markdown(rows)


def _markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def header(record: dict) -> str:
    """Where and how a record was measured: the machine (CPU model, family/model, ISA level, restrictions, flags),
    the command and the commit."""
    m = record["machine"]
    sig = m.get("cpu_signature") or {}
    caps = m.get("isa_caps") or {}
    where = (f"{m.get('cpu', '?')}, family {sig.get('family', '?')} model {sig.get('model', '?')} "
             f"({m.get('microarch', '?')}), {m.get('cores', '?')} cores, ISA level {m.get('isa_level', '?')}"
             + (f", restricted by {' '.join(f'{k}={v}' for k, v in caps.items())}" if caps else "")
             + f"; flags {' '.join(m.get('isa_flags') or [])}: class `{m.get('hardware', '?')}`")
    return f"machine: {where}  \ncommand: `{record['command']}` at commit {record['commit']}, {record['date']}"


def search_block(record: dict) -> str:
    """bench_search.py's record: how its search spent the budget, the best and its compute limit, and the rounds."""
    best = record["best"]
    limit = best.get("compute_limit")
    limit_text = (f"; limit fraction {limit['fraction']:.2f} ({limit['achieved_gflops']:.1f} of "
                  f"{limit['ceiling_gflops']:.1f} GFLOP/s: {limit['how']})" if limit else "")
    return f"{search_summary(record)}  \nbest: {best['label']}{limit_text}\n\n{search_table(record)}"


def render(record: dict) -> str:
    """What a page quotes for this record (its kind: the script that wrote it): its header, then its table."""
    return header(record) + "\n\n" + _RENDERERS[record.get("kind", "search")](record)


_RENDERERS = {"search": search_block, "serve": serve_table, "peer": peer_table, "startup": startup_table,
              "trials": trials_table, "guide": guide_table,
              "profile": profile_table, "goodput": goodput_table, "decode_batch": decode_batch_table}
