"""What one trial costs, split into its parts, for O0, O1 and O2 on the embedded model: build, gate (teacher-forced
windows and drift), compile (dynamo + inductor, from torch's own compile timers), benchmark (warm-up and timed
runs), and how many graphs were compiled. Each configuration runs in a fresh process against a fresh compiler
cache, as a trial of a cold search does.

    python scripts/trial_cost.py [--configs fp32/O0 bf16/O1/split=4 w8a16@fp32/O0] [--repeats 3]

Run it against another checkout (PYTHONPATH=/path/to/other/tree) to compare two versions side by side."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT = ("bf16/O0", "bf16/O1/split=4", "bf16/O2/split=4")


def _params(label: str, batch: int, page: int, threads: int) -> dict:
    """"fp32/O1/split=4" (quant none in fp32) or "w8a16@fp32/O0" (a scheme at a precision)."""
    scheme, level, *rest = label.split("/")
    quant, _, dtype = scheme.partition("@") if "@" in scheme else ("none", "", scheme)
    params = {"quant": quant, "dtype": dtype, "fusion_level": level, "batch_size": batch, "page_size": page,
              "kv_policy": "on_demand", "device_power": threads}
    for item in rest:
        key, _, value = item.partition("=")
        if key == "split":
            params["layers_per_subgraph"] = value if value == "all" else int(value)
    return params


def _one(params: dict, repeats: int) -> dict:
    """In this process: the trial's own code path, timed by stage."""
    import torch
    import torch._dynamo.utils

    from autotune.config.deploy import DeployConfig
    from autotune.config.workload import Workload
    from autotune.devices.cpu import CpuDevice
    from autotune.models.registry import resolve_model
    from autotune.trial.job import Job, JobKind
    from autotune.trial.run import run_job

    config = DeployConfig.from_params(params)
    job = Job(kind=JobKind.TRIAL, model="smollm2-135m", workload=Workload().to_dict(), config=config.to_dict(),
              threads=config.device_power, repeats=repeats)
    resolve_model(job.model)
    started = time.perf_counter()
    result = run_job(job, CpuDevice())
    total = time.perf_counter() - started
    names, values = torch._dynamo.utils.compile_times(repr="csv")
    compile_s = sum(float(v) for name, cell in zip(names, values) if name == "_compile.compile_inner"
                    for v in str(cell).split(","))
    counters = torch._dynamo.utils.counters
    bench = result.bench or {}
    gate = result.gate or {}
    build_s, gate_s = result.build_s or 0.0, gate.get("seconds") or 0.0
    return {"config": config.label(), "status": result.status.value, "reason": result.reason,
            "total_s": total, "build_s": build_s, "gate_s": gate_s, "compile_s": compile_s,
            "graphs": int(counters["stats"].get("unique_graphs", 0)), "warmup_s": bench.get("warmup_s"),
            # Loading the weights, the benchmark (warm-up and timed runs) and whatever else the job did.
            "rest_s": total - build_s - gate_s, "repeats": bench.get("repeats"),
            "throughput_tok_s": bench.get("throughput_tok_s"), "peak_memory_mb": bench.get("peak_memory_mb"),
            "decode_positions": gate.get("decode_positions"),
            "gate_positions": gate.get("positions")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="*", default=list(DEFAULT))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--page", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one configuration, JSON out
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(_one(json.loads(args.one), args.repeats)), flush=True)
        return 0
    rows = []
    for label in args.configs:
        params = _params(label, args.batch, args.page, args.threads)
        with tempfile.TemporaryDirectory(prefix="trial-cost-inductor-") as cold:
            # A cold compiler cache, the warm weights and reference of the usual cache.
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cold, "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
            proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(params), "--repeats",
                                   str(args.repeats)], env=env, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{label}: failed\n{proc.stderr[-3000:]}")
            return 1
        rows.append(json.loads(line[0].removeprefix("RESULT ")))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'configuration':<44} {'total s':>8} {'build s':>8} {'gate s':>8} {'compile s':>9} {'graphs':>6} "
          f"{'load+bench s':>12} {'warm-up s':>9} {'tok/s':>7} {'peak MB':>8}")
    for r in rows:
        def f(key: str) -> str:
            return "-" if r.get(key) is None else f"{r[key]:.1f}"
        print(f"{r['config']:<44} {f('total_s'):>8} {f('build_s'):>8} {f('gate_s'):>8} {f('compile_s'):>9} "
              f"{r['graphs']:>6} {f('rest_s'):>12} {f('warmup_s'):>9} {f('throughput_tok_s'):>7} "
              f"{f('peak_memory_mb'):>8}")
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU")
    print(f"CPU: {cpu}, {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
