"""OpenVINO GenAI as a peer engine and a runtime: its own knobs (weight format and NNCF's compression, inference and
KV cache precision, the scheduler), an IR exported once per model and weight format, driven through its
ContinuousBatchingPipeline, gated against the same fp32 reference and benchmarked on the same workload as autotune's
own engine. Nothing here loads OpenVINO unless an openvino trial runs."""
from __future__ import annotations
