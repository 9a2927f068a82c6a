"""llama.cpp's own knobs, tried one trial each (GGUF type made once, gate on llama.cpp's logits against the fp32
reference, benchmark on the study's workload) through the llamacpp backend, over a grid given on the command line;
prints each trial and the fastest that passed the gate, as JSON for scripts/bench_peer.py --best. A stand-in for a
study until the study's configuration carries these knobs.

    python scripts/sweep_llamacpp.py [--model smollm2-135m] [--threads 2] [--types Q8_0,F16,BF16,source]
        [--parallel 8,16] [--flash-attn on,off] [--kv f16,q8_0] [--ubatch 512] [--batch 2048] [--ctx 4096]"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends.llamacpp import LlamaCppBackend  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.llamacpp.config import LlamaCppConfig  # noqa: E402
from autotune.trial.job import Job, JobKind  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--types", default="Q8_0,F16,BF16,source")
    p.add_argument("--parallel", default="8,16")
    p.add_argument("--flash-attn", default="on,off")
    p.add_argument("--kv", default="f16,q8_0")
    p.add_argument("--batch", default="2048")
    p.add_argument("--ubatch", default="512")
    p.add_argument("--ctx", default="4096")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    grid = []
    for t, np_, fa, kv, b, ub, c in itertools.product(
            args.types.split(","), map(int, args.parallel.split(",")), args.flash_attn.split(","),
            args.kv.split(","), map(int, args.batch.split(",")), map(int, args.ubatch.split(",")),
            map(int, args.ctx.split(","))):
        try:
            grid.append(LlamaCppConfig(gguf_type=t, threads=args.threads, parallel=np_, flash_attn=fa, kv_type=kv,
                                       n_batch=b, n_ubatch=ub, n_ctx=c))
        except ValueError as exc:  # a quantized V cache without flash attention: llama.cpp refuses it
            print(f"skip {t}/fa={fa}/kv={kv}: {exc}", flush=True)
    backend = LlamaCppBackend()
    results = []
    for i, config in enumerate(grid):
        job = Job(kind=JobKind.TRIAL, model=args.model, workload=Workload().to_dict(), config=config.to_dict(),
                  threads=args.threads, repeats=args.repeats)
        r = backend.run(job, timeout_s=1200)
        bench, gate = r.bench or {}, r.gate or {}
        line = (f"{i + 1}/{len(grid)} {config.label()}: {r.status.value}"
                + (f", {bench['throughput_tok_s']:.1f} tok/s, TPOT p50 {bench['tpot_p50_ms']:.1f} ms, TTFT p50 "
                   f"{bench['ttft_p50_ms']:.0f} ms, peak {bench['peak_memory_mb']:.0f} MB" if bench else "")
                + (f", gate {gate['tie_aware_agreement']:.4f} / decode {gate.get('decode_agreement')}" if gate else "")
                + (f", {r.reason}" if r.reason else ""))
        print(line, flush=True)
        results.append((config, r))
    passed = [(c, r) for c, r in results if r.ok and r.bench]
    if passed:
        best, r = max(passed, key=lambda cr: cr[1].bench["throughput_tok_s"])
        print(f"best: {best.label()} {r.bench['throughput_tok_s']:.1f} tok/s")
        print(json.dumps(best.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
