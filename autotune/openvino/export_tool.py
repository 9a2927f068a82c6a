"""Run by the export environment's Python (autotune/openvino/export_env.py), never imported by autotune: it imports
optimum-intel and NNCF, which need a transformers older than autotune's.

  python export_tool.py export MODEL_FOLDER OUT        the fp32 IR of a Hugging Face folder (optimum-intel)
  python export_tool.py compress SPEC.json             one weight format derived from that IR (OpenVINO, NNCF)

SPEC.json: {"base": IR folder, "out": folder, "weight_format": fp16|int8|int4, "int4_method", "group_size",
"ratio", "samples": token id lists for the data-aware methods}. Each writes OUT/openvino_model.xml and .bin beside
the tokenizer's IRs and the model's configuration files."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

# Beside the model's IR: what ContinuousBatchingPipeline reads from the folder (the tokenizer's own IRs, the
# generation defaults, the chat template).
_BESIDE = ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml", "openvino_detokenizer.bin",
           "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
           "special_tokens_map.json")


def export(model_folder: str, out: str) -> None:
    from optimum.exporters.openvino import main_export

    # fp32: every other format is derived from it, so that an int8 scale is chosen from the checkpoint's values,
    # not from values already rounded to fp16.
    main_export(model_folder, output=out, task="text-generation-with-past", weight_format="fp32",
                library_name="transformers")


def _dataset(model, samples: list[list[int]]):
    import nncf
    import numpy as np

    # One whole sequence per sample through the stateful model (NNCF resets its state before each).
    def inputs(ids: list[int]) -> dict:
        n = len(ids)
        out = {"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, n), dtype=np.int64)}
        names = {i.get_any_name() for i in model.inputs}
        if "position_ids" in names:
            out["position_ids"] = np.arange(n, dtype=np.int64)[None]
        if "beam_idx" in names:
            out["beam_idx"] = np.zeros(1, dtype=np.int32)
        return out

    return nncf.Dataset(samples, inputs)


def compress(spec: dict) -> None:
    import openvino as ov

    base, out = Path(spec["base"]), Path(spec["out"])
    model = ov.Core().read_model(base / "openvino_model.xml")
    fmt = spec["weight_format"]
    if fmt in ("int8", "int4"):
        import nncf

        if fmt == "int8":
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
        else:
            method = spec["int4_method"]
            data_aware = method != "data_free"
            model = nncf.compress_weights(
                model, mode=nncf.CompressWeightsMode.INT4_ASYM, group_size=spec["group_size"], ratio=spec["ratio"],
                dataset=_dataset(model, spec["samples"]) if data_aware else None,
                subset_size=len(spec["samples"]) if data_aware else 128,
                awq=method in ("awq", "awq_se"), scale_estimation=method in ("scale_estimation", "awq_se"),
                # The ratio's int4 layers are ranked by what the data says where there is data, else by weights.
                sensitivity_metric=(nncf.SensitivityMetric.HESSIAN_INPUT_ACTIVATION if data_aware
                                    else nncf.SensitivityMetric.WEIGHT_QUANTIZATION_ERROR))
    elif fmt not in ("fp16", "fp32"):
        raise SystemExit(f"unknown weight format {fmt!r}")
    out.mkdir(parents=True, exist_ok=True)
    # fp16: the constants stored in half precision, decompressed by the plugin (optimum's --weight-format fp16).
    ov.save_model(model, out / "openvino_model.xml", compress_to_fp16=fmt == "fp16")
    for name in _BESIDE:
        if (base / name).is_file():
            shutil.copy2(base / name, out / name)


def main(argv: list[str]) -> int:
    if argv[:1] == ["export"] and len(argv) == 3:
        export(argv[1], argv[2])
    elif argv[:1] == ["compress"] and len(argv) == 2:
        compress(json.loads(Path(argv[1]).read_text()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
