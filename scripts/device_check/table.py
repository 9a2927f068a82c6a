"""Print the device check's one table: a row per trial of its study (configuration, status, throughput, latency,
peak device memory, the speed-up over the baseline, compile seconds and CUDA graph skips), then the baseline and
the best configuration.

Usage: python table.py STUDY STORAGE."""
from __future__ import annotations

import sys

import optuna

from autotune.config.deploy import DeployConfig


def main(study_name: str, storage: str) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    base = study.user_attrs.get("speed_baseline", {}).get("bench", {})
    base_tput = base.get("throughput_tok_s")
    print(f"{'#':>2}  {'configuration':<52} {'status':<7} {'tok/s':>8} {'TTFT p50':>9} {'TPOT p50':>9} "
          f"{'peak MB':>8} {'vs base':>7} {'compile':>8} {'graph skips':>11}")
    best = None
    for t in study.trials:
        attrs = t.user_attrs
        if t.state is optuna.trial.TrialState.WAITING:  # queued by plan.py, not reached within the time limits
            config = DeployConfig.from_params(t.system_attrs.get("fixed_params", {})).label()
            print(f"{t.number:>2}  {config:<52} {'not run':<7} (the study's time limit came first)")
            continue
        config = DeployConfig.from_dict(attrs["config"]).label() if "config" in attrs else str(t.params)
        bench = attrs.get("bench")
        compile_s = (attrs.get("timing") or {}).get("compile_s")
        skips = (attrs.get("compile_cache") or {}).get("cudagraph_skips")
        tail = f"{compile_s or 0:>7.0f}s {'-' if skips is None else skips:>11}"
        if not bench:
            reason = attrs.get("reason", "") or t.state.name
            print(f"{t.number:>2}  {config:<52} {attrs.get('status', t.state.name)[:7]:<7} {reason[:90]}")
            continue
        ratio = bench["throughput_tok_s"] / base_tput if base_tput else float("nan")
        print(f"{t.number:>2}  {config:<52} {'ok':<7} {bench['throughput_tok_s']:>8.1f} {bench['ttft_p50_ms']:>7.1f}ms "
              f"{bench['tpot_p50_ms']:>7.2f}ms {bench['peak_memory_mb']:>8.0f} {ratio:>6.2f}x {tail}")
        if best is None or bench["throughput_tok_s"] > best[1]["throughput_tok_s"]:
            best = (config, bench)
    if base:
        print(f"baseline (transformers generate, bf16, eager): {base_tput:.1f} tok/s, TTFT p50 "
              f"{base['ttft_p50_ms']:.1f} ms, TPOT p50 {base['tpot_p50_ms']:.2f} ms, "
              f"peak {base['peak_memory_mb']:.0f} MB")
    if best and base_tput:
        print(f"best: {best[0]}: {best[1]['throughput_tok_s']:.1f} tok/s = "
              f"{best[1]['throughput_tok_s'] / base_tput:.2f}x the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
