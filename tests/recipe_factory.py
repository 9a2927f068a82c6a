"""Test helper: a study storage holding what `autotune search` would have recorded, without running a search."""
from __future__ import annotations

from pathlib import Path

import optuna

from autotune.config.deploy import DeployConfig
from autotune.gate.design import GATE_VERSION

TINY_WORKLOAD = {"num_requests": 4, "prompt_min": 12, "prompt_max": 20, "output_tokens": 8, "arrival": "offline",
                 "seed": 0}
GATE = {"tie_aware_agreement": 0.999, "raw_agreement": 0.99, "perplexity": 10.0, "reference_perplexity": 10.0,
        "kl_divergence": 0.001, "decode_agreement": 1.0, "decode_raw_agreement": 0.99, "decode_first_miss": None,
        "decode_positions": 1536, "decode_prompts": 48, "decode_interval": [0.9976, 1.0], "decode_passed": True,
        "decode_decided": True, "positions": 4088, "tie_epsilon": 0.05, "min_agreement": 0.995, "passed": True,
        "version": GATE_VERSION}


def bench(tput: float, tpot: float, mem: float) -> dict:
    return {"throughput_tok_s": tput, "throughput_min": tput * 0.95, "throughput_max": tput * 1.05,
            "ttft_p50_ms": 20.0, "ttft_p99_ms": 30.0, "tpot_p50_ms": tpot * 0.9, "tpot_p99_ms": tpot,
            "peak_memory_mb": mem, "kv_reserved_peak_mb": 1.0, "repeats": 3}


def make_study(folder: Path, model: Path, storage_dir: Path, name: str = "tiny-cpu",
               points: list[tuple[dict, dict, dict | None, dict]] | None = None,
               measured: bool = True, sim_hardware: str = "h100",
               trial_attrs: dict | None = None) -> tuple[optuna.Study, str]:
    """points: (config, bench, gate, constraints) per trial; a gate with passed False is recorded as pruned.
    A simulated study (measured False) is of the hardware profile `sim_hardware`. `trial_attrs`: set on every trial
    (what the search records of how it ran: `measured_under`)."""
    from autotune.backends.cpu import CpuBackend
    from autotune.models.registry import resolve_model
    from autotune.models.weights import model_checksum

    url = f"sqlite:///{storage_dir / (name + '.db')}"
    study = optuna.create_study(study_name=name, storage=url, directions=["maximize", "minimize", "minimize"],
                                load_if_exists=True)
    spec = resolve_model(str(model))
    attrs = {"model": str(model), "model_source": spec.source, "model_checksum": model_checksum(spec),
             "backend": "cpu" if measured else "sim", "measured": measured,
             "hardware": CpuBackend().fingerprint() if measured else {"hardware": sim_hardware, "simulated": True},
             "workload": TINY_WORKLOAD,
             "speed_baseline": {"what": "transformers generate, bf16, eager, dynamic cache", "batch_size": 8,
                                "bench": bench(100.0, 50.0, 400.0)}}
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    versions = {"python": "3.11", "torch": "x"} if measured else {"simulator": "1", "profile": f"{sim_hardware} v2"}
    for config, figures, gate, constraints in points or []:
        user = {"config": config, "bench": figures, "gate": gate, "versions": versions, "threads": 2,
                "build_s": 0.5, "constraints": constraints, **(trial_attrs or {})}
        if gate is not None and not gate.get("passed", True):
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs=user))
            continue
        values = [figures["throughput_tok_s"], figures["tpot_p99_ms"], figures["peak_memory_mb"]]
        study.add_trial(optuna.trial.create_trial(values=values, user_attrs=user, constraints=constraints or None))
    return study, url


def config(**kw) -> dict:
    return DeployConfig.from_dict({"batch_size": 4, "page_size": 16, **kw}).to_dict()


def tiny_recipe(tmp: Path, model: Path, **config_kw) -> Path:
    """Export one recipe of the tiny model (configuration `config_kw`) and return its path."""
    from autotune.results.export import write_recipes

    study, url = make_study(tmp, model, tmp, name=f"tiny-{len(list(tmp.glob('*.db')))}",
                            points=[(config(**config_kw), bench(200.0, 10.0, 100.0), GATE, {})])
    return next(p for p in write_recipes(study, tmp / "recipes", url) if p.name == "best-throughput.yaml")


class Served:
    """A real server on a free loopback port: HTTP and the engine loop each on a background thread."""

    def __init__(self, recipe_path: Path, max_queue: int = 64, draft: bool = False, access=None) -> None:
        from autotune.recipes.recipe import load_recipe
        from autotune.serve import build_server

        self.server = build_server(load_recipe(recipe_path), "127.0.0.1", 0, max_queue=max_queue, draft=draft,
                                   access=access)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop()

    def post(self, path: str, body: object, raw: bytes | None = None, timeout: float = 120) -> tuple[int, dict]:
        import http.client
        import json

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("POST", path, raw if raw is not None else json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, (json.loads(data) if data.startswith(b"{") else {"raw": data.decode()})

    def get(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
