"""`autotune predict` and `autotune hardware`: the simulator's own commands."""
from __future__ import annotations

import argparse
import json

from autotune.cli.args import positive, token_range
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.errors import UserInputError
from autotune.models.registry import resolve_model
from autotune.sim.hardware import list_profiles, load_profile
from autotune.sim.predict import predict

__all__ = ["register"]
_INT_KEYS = ("batch_size", "page_size", "device_power")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict one configuration on a hardware profile (simulated, not measured)")
    p.add_argument("--model", default="llama-7b",
                   help="registry name (autotune models), local Hugging Face folder, or Hub id (org/name)")
    p.add_argument("--hardware", required=True, help="a profile of `autotune hardware`")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="configuration, e.g. quant=w8a16 batch_size=1 fusion_level=O2 layers_per_subgraph=2")
    p.add_argument("--requests", type=positive(int), default=16, help="requests of the offline workload")
    p.add_argument("--prompt-tokens", type=token_range, default=(112, 144), help="MIN:MAX prompt tokens")
    p.add_argument("--output-tokens", type=positive(int), default=64)
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.set_defaults(func=_predict)
    sub.add_parser("hardware", help="the hardware profiles of the simulator: peaks, memory, calibration").set_defaults(
        func=_hardware)


def _config(pairs: list[str]) -> DeployConfig:
    params: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserInputError(f"--set takes KEY=VALUE pairs, not {pair!r}")
        if key in _INT_KEYS:
            try:
                params[key] = int(value)
            except ValueError:
                raise UserInputError(f"--set {key} needs a whole number, not {value!r}") from None
        else:
            params[key] = value
    if params.get("fusion_level", "O0") != "O0" and "layers_per_subgraph" not in params:
        raise UserInputError("fusion levels O1 and O2 need layers_per_subgraph (a number, or all)")
    try:
        return DeployConfig.from_params(params)
    except ValueError as exc:
        raise UserInputError(f"--set: {exc}") from None


def _predict(args) -> int:
    spec, profile = resolve_model(args.model), load_profile(args.hardware)
    # Without --set dtype=..., the profile's fastest precision (an Ascend 910 has no bf16).
    config = _config([f"dtype={profile.fastest_precision}", *args.set])
    try:
        workload = Workload(num_requests=args.requests, prompt_min=args.prompt_tokens[0],
                            prompt_max=args.prompt_tokens[1], output_tokens=args.output_tokens)
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    result = predict(spec, config, workload, profile)
    if args.json:
        print(json.dumps({"source": "simulated", "profile": profile.label, "calibration": profile.calibration_source,
                          "model": spec.name, "config": config.to_dict(), "workload": workload.to_dict(),
                          **result.to_dict()}, indent=1))
    else:
        print(f"SIMULATED on {profile.label} ({profile.calibration_source}); not measured")
        print(f"model {spec.name}, {config.label()}, {workload.num_requests} requests of "
              f"{workload.prompt_min}-{workload.prompt_max} prompt + {workload.output_tokens} output tokens")
        if not result.feasible:
            print(f"INFEASIBLE: {result.reason}")
        energy = "-" if result.energy_per_token_j is None else f"{result.energy_per_token_j:.3f} J"
        print(f"throughput {result.throughput_tok_s:.1f} tok/s | TTFT p50 {result.ttft_p50_ms:.1f} ms, p99 "
              f"{result.ttft_p99_ms:.1f} ms | TPOT p50 {result.tpot_p50_ms:.2f} ms, p99 {result.tpot_p99_ms:.2f} ms")
        print(f"memory {result.peak_memory_mb / 1024:.2f} GiB (KV {result.kv_reserved_mb:.0f} MiB in "
              f"{result.kv_pages} pages) | energy/token {energy} | decode bound by {result.decode_bound}")
        for note in result.notes:
            print(f"note: {note}")
    return 0 if result.feasible else 1


def _hardware(args) -> int:
    print(f"{'profile':<14} {'fp32':>6} {'fp16':>6} {'bf16':>6} {'int8 TOPS':>9} {'memory':>8} {'GB/s':>6} "
          f"{'power':>6}  {'device_power':<14} calibration   (TFLOPS per precision; - : not native)")
    for name in list_profiles():
        p = load_profile(name)
        power = "-" if p.power_w is None else f"{p.power_w:.0f} W"
        levels = ",".join(map(str, sorted(p.power_levels))) if p.power_levels else "none"
        rates = " ".join(f"{p.tflops[d]:>6.1f}" if d in p.tflops else f"{'-':>6}" for d in ("fp32", "fp16", "bf16"))
        print(f"{p.label:<14} {rates} {p.int8_tops:>9.1f} {p.memory_gb:>6.0f}Gi {p.bandwidth_gbs:>6.0f} "
              f"{power:>6}  {p.power_kind + ' ' + levels:<14} {p.calibration_source}")
    return 0
