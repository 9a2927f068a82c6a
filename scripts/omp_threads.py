"""Why `autotune serve` keeps its engine on the thread that built it: the same bf16 matmuls (a decode step's
shapes, weights beyond the caches) timed on the main thread, then on a second thread after the main thread ran
torch's OpenMP, each in a fresh process, alternating, medians.

    python scripts/omp_threads.py [--rounds 3] [--threads 2]

libgomp keeps a worker pool per thread that ever ran a parallel region; once it manages more workers than CPUs, its
idle workers sleep instead of spinning, and every parallel region then waits for them to wake."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = """
import threading, time, torch
torch.set_num_threads({threads})
x = torch.randn(8, 576, dtype=torch.bfloat16)
ws = [torch.randn(1536, 576, dtype=torch.bfloat16) for _ in range(100)]
def bench(out):
    for w in ws: torch.nn.functional.linear(x, w)
    t = time.perf_counter()
    for _ in range(20):
        for w in ws: torch.nn.functional.linear(x, w)
    out.append((time.perf_counter() - t) / 2000 * 1e6)
out = []
bench(out)  # the main thread runs OpenMP, as `autotune serve` does when it builds the engine
if {second}:
    out.clear()
    th = threading.Thread(target=bench, args=(out,)); th.start(); th.join()
print(out[-1])
"""


def _time(second: bool, threads: int) -> float:
    code = CHILD.format(threads=threads, second=second)
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    main_us, second_us = [], []
    for _ in range(args.rounds):
        main_us.append(_time(False, args.threads))
        second_us.append(_time(True, args.threads))
    m, s = statistics.median(main_us), statistics.median(second_us)
    print(f"[8x576] x [576x1536] bf16, {args.threads} threads, median of {args.rounds} processes each")
    print(f"  on the main thread:                      {m:6.0f} us  {[round(v) for v in main_us]}")
    print(f"  on a second thread (main ran OpenMP):    {s:6.0f} us  {[round(v) for v in second_us]}")
    print(f"  second / main: {s / m:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
