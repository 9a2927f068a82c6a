"""Goodput of recipes as served, side by side in one run: `autotune serve` of each, and the trial's goodput search
sent over HTTP to it, under one SLO.

    python scripts/bench_goodput.py RECIPE [RECIPE ...] --slo ttft=1s,tpot=100ms [--attainment 0.9] [--rounds 3]
                                    [--budget 60] [--names best-goodput,baseline] [--port 8770]

Every recipe's server is started once, in its own process, one after another (each built and warmed up, as a user
starts it), and stays up. The rounds then run one goodput search per server in turn, the order reversed every other
round, so that the machine's drift falls on all of them alike; an idle server only waits for requests. A search is
the trial's own (benchmark/goodput.py: from a start rate, double or halve, then bisect, within --budget seconds),
its probes the trial's probes sent over HTTP: the same open-loop workload (the recipe's prompt lengths from the
shipped text, Poisson arrivals at the rate, output lengths drawn from half to all of the recipe's output tokens,
each probe its own prompts), each request streamed by `autotune loadtest`'s client on its own task and timed from
its due time, a failed request a miss. It starts from the goodput the recipe's trial measured, where it has one,
else from the recipe's offline throughput in requests per second.

The record (docs/data/bench_goodput-MODEL-MACHINE.json) has every round's search; the table gives each recipe's
served goodput (median and range of the rounds), the trial's beside it, and the first recipe's ratio to each
other one, "higher" or "lower" only where no round of one overlaps a round of the other."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends import get_backend  # noqa: E402
from autotune.benchmark.goodput import search_probes  # noqa: E402
from autotune.config.arrival import load_requests  # noqa: E402
from autotune.config.slo import parse_slo  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.gate.corpus import bench_prompts  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_tokenizer  # noqa: E402
from autotune.recipes.recipe import load_recipe  # noqa: E402
from autotune.serve.loadtest import stream_request  # noqa: E402
from autotune.serve.open_loop_http import judge, send_at_arrivals  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import compare, machine, spread, write  # noqa: E402
from bench_tables import goodput_table  # noqa: E402

START_S = 1800.0  # a server's first start may compile its graphs


class _Server:
    """`autotune serve RECIPE` in its own process, its log in a file (a pipe nobody reads would fill and stall it)."""

    def __init__(self, recipe: Path, port: int, log_dir: Path) -> None:
        self.port, self.log = port, log_dir / f"serve-{port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", str(recipe), "--port",
                                          str(port)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"autotune serve {recipe} did not come up:\n{self.log.read_text()[-2000:]}")
            time.sleep(2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _search(port: int, recipe, tokenizer, slo, budget_s: float, probes_before: int) -> dict:
    """The trial's goodput search (benchmark/goodput.search_probes) with its probes sent to the server, from the
    trial's goodput (its offline throughput where it had none)."""
    workload = Workload(**recipe.data["workload"])

    def run(w: Workload):
        requests = load_requests(w, bench_prompts(tokenizer, w.num_requests, w.prompt_min, w.prompt_max, w.seed))
        # The served model's name is its folder's (serve/app.py); every request exactly its drawn length.
        bodies = [{"model": Path(recipe.model).name, "prompt": tokenizer.decode(r.prompt_ids),
                   "max_tokens": r.new_tokens, "min_tokens": r.new_tokens, "ignore_eos": True, "temperature": 0.0,
                   "stream": True, "stream_options": {"include_usage": True}} for r in requests]
        outcomes, seconds = send_at_arrivals(stream_request, "127.0.0.1", port, bodies, [r.due for r in requests])
        return judge(outcomes, slo, w.rate, seconds)

    trial = recipe.data.get("goodput") or {}
    start = trial.get("goodput_tok_s") or recipe.data["metrics"]["throughput_tok_s"]
    return search_probes(run, workload, slo, start, budget_s=budget_s, probes_before=probes_before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="+")
    parser.add_argument("--slo", required=True, help="ttft=1s,tpot=100ms")
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds each goodput search may take")
    parser.add_argument("--names", help="a name per recipe, comma-separated (default: the file names)")
    parser.add_argument("--port", type=int, default=8770, help="the first server's; the others the next ones")
    args = parser.parse_args()
    slo = parse_slo(args.slo, args.attainment)
    paths = [Path(p).resolve() for p in args.recipes]
    names = args.names.split(",") if args.names else [p.stem for p in paths]
    if len(names) != len(paths) or len(set(names)) != len(names):
        raise SystemExit("--names: one distinct name per recipe")
    recipes = [load_recipe(p) for p in paths]
    models = {r.model for r in recipes}
    if len(models) != 1:
        raise SystemExit(f"the recipes are of several models ({sorted(models)}): compare recipes of one")
    spec = resolve_model(recipes[0].model)
    tokenizer = load_tokenizer(spec)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-goodput-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: list[_Server] = []
    rounds: list[dict] = []
    try:
        for i, (name, path) in enumerate(zip(names, paths)):
            print(f"starting {name}: autotune serve {path}", flush=True)
            servers.append(_Server(path, args.port + i, log_dir))
        for k in range(args.rounds):
            order = list(range(len(paths))) if k % 2 == 0 else list(reversed(range(len(paths))))
            for i in order:
                result = _search(servers[i].port, recipes[i], tokenizer, slo, args.budget, probes_before=100 * k)
                rounds.append({"round": k, "recipe": names[i], **result})
                print(f"round {k + 1}/{args.rounds} {names[i]}: goodput {result['goodput_req_s']:.3g} req/s "
                      f"({result['goodput_tok_s']:.1f} tok/s), {result['probes']} probes", flush=True)
    finally:
        for server in servers:
            server.close()
    entries = {}
    for name, path, recipe in zip(names, paths, recipes):
        mine = [r for r in rounds if r["recipe"] == name]
        trial = recipe.data.get("goodput") or {}
        entries[name] = {"recipe": str(path), "configuration": recipe.config.label(),
                         "goodput_req_s": spread([r["goodput_req_s"] for r in mine]),
                         "goodput_tok_s": spread([r["goodput_tok_s"] for r in mine]),
                         "trial_goodput_req_s": trial.get("goodput_req_s"),
                         "trial_slo": trial.get("slo")}
    first = names[0]
    for name in names[1:]:
        a, b = entries[first]["goodput_req_s"], entries[name]["goodput_req_s"]
        entries[name]["first_ratio"] = a["median"] / b["median"] if b["median"] else None
        entries[name]["order"] = compare(a["rounds"], b["rounds"])
    fingerprint = get_backend("cpu").fingerprint()
    record = {"kind": "goodput", "machine": machine(fingerprint), "model": spec.name, "slo": slo.to_dict(),
              "budget_s": args.budget, "first": first, "recipes": entries, "rounds": rounds}
    write(f"bench_goodput-{spec.name}-{fingerprint['hardware']}", record)
    print(goodput_table(record))
    print(json.dumps({n: e["goodput_req_s"]["median"] for n, e in entries.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
