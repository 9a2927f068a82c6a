"""The benchmark: a workload run on a built engine (or on transformers' generate, the speed baseline), with
throughput, latency percentiles and measured peak memory."""
