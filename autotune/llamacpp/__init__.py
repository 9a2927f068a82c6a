"""llama.cpp as a peer engine and a backend: its own knobs (GGUF type, threads, batch sizes, flash attention, KV
cache type, parallel sequences, context size), driven through llama-cpp-python, gated against the same fp32
reference and benchmarked on the same workload as autotune's own engine. Optional: `pip install autotune[llamacpp]`
or scripts/build_llamacpp.sh; nothing here is imported unless the llamacpp backend is asked for."""
from __future__ import annotations
