"""How long `autotune serve RECIPE` takes from launch to serving, for a first start and for the start after it.

    python scripts/bench_startup.py RECIPE [--rounds 2] [--port 8775] [--starts first,second,after-trial]

Each round gives the server a fresh cache folder holding only what a machine has once it has searched: the
converted model and the fp32 reference (copied from this machine's cache, where they are made first if missing).
- first start: nothing else is cached. An O2 recipe compiles its AOTInductor packages, then runs its first-start
  check (the decode check and one timed run on the program to be served) and the warm-up.
- second start: the same folder again: the packages and the check are read from the start-up cache, then the
  warm-up.
- after its trial: another fresh folder, where the recipe's trial runs first as a search runs it (build, gate,
  benchmark, in a child process: not timed here), then the first start: what the machine that searched pays, the
  packages its trial compiled loaded (devices/kept_packages.py).
The figure is the wall time from launching the process to its "serving" line (the server answers from then on).
Each round's figures and the medians go to docs/data/bench_startup-MODEL-HARDWARE.json (bench_record.py)."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends import get_backend  # noqa: E402
from autotune.gate.cache import reference_path  # noqa: E402
from autotune.gate.corpus import EVAL_POSITIONS, eval_set_digest  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import model_checksum  # noqa: E402
from autotune.paths import cache_root  # noqa: E402
from autotune.recipes.recipe import load_recipe  # noqa: E402
from autotune.trial.job import Job, JobKind  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import machine, spread, write  # noqa: E402
from bench_tables import startup_table  # noqa: E402

KINDS = ({"name": "first start", "what": "empty start-up and compiler caches: build (O2: compile the packages), "
          "first-start check, warm-up"},
         {"name": "second start", "what": "the same cache again: packages and check read back, warm-up"},
         {"name": "after its trial", "what": "a first start where the recipe's trial ran before (as on the machine "
          "that searched): its packages loaded, the rest compiled, first-start check, warm-up"})
STARTS = {"first": "first start", "second": "second start", "after-trial": "after its trial"}
# What a machine that has searched holds, copied into each round's cache folder.
_KEEP = ("models", "reference")


def _start(recipe: str, port: int, cache: Path) -> tuple[float, list[str]]:
    env = {**os.environ, "AUTOTUNE_CACHE": str(cache)}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", os.path.abspath(recipe), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            print(f"  serve: {line.rstrip()}", flush=True)
            if line.startswith("serving "):
                return time.perf_counter() - started, lines
        raise SystemExit(f"the server exited ({proc.wait()}) before serving")
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def _trial(recipe, backend, cache: Path) -> float:
    """The recipe's trial, as the search ran it, with `cache` as the cache folder; its wall time."""
    job = Job(kind=JobKind.TRIAL, model=recipe.model, workload=recipe.data["workload"],
              config=recipe.config.to_dict(), keep=list(recipe.kept_layers) or None)
    before = os.environ.get("AUTOTUNE_CACHE")
    os.environ["AUTOTUNE_CACHE"] = str(cache)  # the trial's child inherits it
    started = time.perf_counter()
    try:
        result = backend.run(job, 3600)
    finally:
        if before is None:
            os.environ.pop("AUTOTUNE_CACHE")
        else:
            os.environ["AUTOTUNE_CACHE"] = before
    if result.status.value != "ok":
        raise SystemExit(f"the recipe's trial did not pass here ({result.status.value}: {result.reason})")
    return time.perf_counter() - started


def _fresh_cache(root: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="startup-", dir=root))
    os.chmod(folder, 0o700)
    for name in _KEEP:
        if (cache_root() / name).is_dir():
            shutil.copytree(cache_root() / name, folder / name)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8775)
    parser.add_argument("--starts", default=",".join(STARTS),
                        help=f"which starts, comma-separated, of {', '.join(STARTS)} (second needs first)")
    args = parser.parse_args()
    starts = [STARTS[name] for name in args.starts.split(",")]
    if "second start" in starts and "first start" not in starts:
        parser.error("--starts: a second start follows a first start")
    recipe = load_recipe(args.recipe)
    spec = resolve_model(recipe.model)
    backend = get_backend("cpu")
    if not reference_path(model_checksum(spec), eval_set_digest(EVAL_POSITIONS)).is_file():
        print("the fp32 reference, once (what a search leaves in the cache)", flush=True)
        backend.run(Job(kind=JobKind.REFERENCE, model=recipe.model, workload=recipe.data["workload"]), 3600)
    kinds = [k for k in KINDS if k["name"] in starts]
    rounds: dict[str, list[float]] = {k["name"]: [] for k in kinds}
    logs: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        for r in range(args.rounds):
            cache = _fresh_cache(scratch)
            for kind in kinds:
                extra = {}
                if kind["name"] == "after its trial":
                    shutil.rmtree(cache, ignore_errors=True)
                    cache = _fresh_cache(scratch)
                    extra["trial_s"] = round(_trial(recipe, backend, cache), 1)
                    print(f"round {r + 1}/{args.rounds}: the recipe's trial took {extra['trial_s']:.1f} s",
                          flush=True)
                seconds, lines = _start(args.recipe, args.port, cache)
                rounds[kind["name"]].append(round(seconds, 1))
                logs.append({"round": r + 1, "start": kind["name"], "seconds": round(seconds, 1), **extra,
                             "log_tail": lines[-12:]})
                print(f"round {r + 1}/{args.rounds} {kind['name']}: {seconds:.1f} s", flush=True)
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fingerprint = backend.fingerprint()
    record = {"kind": "startup", "machine": machine(fingerprint),
              "recipe": {"path": args.recipe, "model": recipe.model, "label": recipe.config.label()},
              "kinds": kinds, "rounds": logs, "seconds": {name: spread(v) for name, v in rounds.items()}}
    write(f"bench_startup-{Path(recipe.model).name}-{fingerprint['hardware']}", record)
    print(startup_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
