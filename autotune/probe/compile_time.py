"""How fast this machine compiles: one small inductor compile (a two-layer RMSNorm + SwiGLU block, its generated C++
built by this machine's compiler) timed in a fresh process with an empty inductor cache. A trial's compile cost is
predicted from it (autotune/study/compile_cost.py) before the study has compiled anything itself, so that a fast
machine is not kept from compiled builds by a prior that fits a slow one, nor a slow one handed a limit that a
compile cannot keep.

    python -m autotune.probe.compile_time     # prints {"compile_s": ...}
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from autotune.errors import AutotuneError

__all__ = ["time_small_compile", "measure_compile_s", "PROBE_TIMEOUT_S"]

# Far above any machine's few seconds: a compile that takes this long is broken, not slow.
PROBE_TIMEOUT_S = 600.0


def time_small_compile() -> float:
    """Seconds of the first call of the compiled block in this process (dynamo, inductor, the C++ build)."""
    import torch

    torch.set_num_threads(1)
    hidden, inner = 64, 176

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.RMSNorm(hidden)
            self.up = torch.nn.Linear(hidden, 2 * inner, bias=False)
            self.down = torch.nn.Linear(inner, hidden, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate, up = self.up(self.norm(x)).chunk(2, dim=-1)
            return x + self.down(torch.nn.functional.silu(gate) * up)

    model = torch.nn.Sequential(Block(), Block()).eval()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, hidden)  # x: [rows, hidden]
    with torch.inference_mode():
        started = time.perf_counter()
        compiled(x)
        return time.perf_counter() - started


def measure_compile_s() -> float:
    """`time_small_compile` in a child process whose inductor cache is empty and its own (so nothing is a hit)."""
    with tempfile.TemporaryDirectory(prefix="autotune-compile-probe-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
        try:
            done = subprocess.run([sys.executable, "-m", "autotune.probe.compile_time"], env=env, text=True,
                                  capture_output=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AutotuneError(f"the compile probe did not finish in {PROBE_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            tail = " ".join(done.stderr.split()[-40:])
            raise AutotuneError(f"the compile probe failed (exit {done.returncode}): {tail}")
        return float(json.loads(done.stdout.strip().splitlines()[-1])["compile_s"])


if __name__ == "__main__":
    print(json.dumps({"compile_s": round(time_small_compile(), 3)}))
