"""Write a random model of another supported architecture as a Hugging Face folder, with SmolLM2's tokenizer (so that
the shipped text tokenizes), to try `autotune search --model FOLDER` on a model that is not SmolLM2.

    python scripts/make_model_folder.py qwen3-tiny-peaked OUT     # 4 layers, hidden 64, weights of std 0.5
    python scripts/make_model_folder.py gemma3-270m-random OUT    # google/gemma-3-270m's shapes, default init
    python scripts/make_model_folder.py qwen2-0.5b-peaked OUT     # Qwen/Qwen2-0.5B's shapes, weights of std 0.2
    python scripts/make_model_folder.py qwen2-0.5b-peaked OUT --std 0.08   # another std
    python scripts/make_model_folder.py qwen2-0.5b-scaled OUT     # the same shapes, bf16 agreeing as trained ones do

The Gemma one has the published gemma-3-270m config's shapes (18 layers, hidden 640, 4 heads, 1 KV head of 256,
vocabulary 262,144, a 512-token sliding window on five of every six layers); its weights are random, so its
figures are of the shapes, not of the model. The Qwen2 one has Qwen/Qwen2-0.5B's published shapes (24 layers,
hidden 896, 14 heads, 2 KV heads of 64, intermediate 4,864, vocabulary 151,936, tied embeddings: 494 M parameters,
about 3.7x SmolLM2-135M); its weights have std 0.2, so that its output distributions are peaked and the accuracy
gate decides, as on a trained model, rather than passing near-ties; but at that std bf16's rounding changes most
greedy tokens, so nothing but fp32 passes. The scaled one (SCALES) keeps the outputs peaked and bf16 agreeing."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import weights_folder  # noqa: E402

_SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
KINDS = {
    "qwen3-tiny-peaked": ("Qwen3Config", dict(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, initializer_range=0.5,
        tie_word_embeddings=False, **_SPECIAL)),
    "qwen2-0.5b-peaked": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        initializer_range=0.2, tie_word_embeddings=True, **_SPECIAL)),
    "qwen2-0.5b-scaled": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        initializer_range=0.2, tie_word_embeddings=True, **_SPECIAL)),
    "gemma3-270m-random": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}, **_SPECIAL)),
}

SAVED_DTYPE = {"qwen2-0.5b-peaked": torch.bfloat16, "qwen2-0.5b-scaled": torch.bfloat16}
# Each linear layer of these names multiplied after the init (std 0.2 everywhere): attention logits small enough not
# to saturate (q, k), MLPs and residual writes of moderate gain. Without them a random deep net is chaotic: bf16's
# rounding alone changed half of the greedy tokens (raw 0.50 at std 0.2; at std 0.12 and below every position was a
# near tie). With them, over 1,536 teacher-forced positions of the evaluation text: 15% near ties, bf16 against fp32
# tie-aware 0.9992 (raw 0.968), and one MLP's output zeroed 0.83 (raw 0.78).
SCALES = {"qwen2-0.5b-scaled": {"q_proj": 0.03, "k_proj": 0.03, "gate_proj": 0.2, "up_proj": 0.2, "o_proj": 0.3,
                                "down_proj": 0.3}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=None,
                        help="the weights' standard deviation (initializer_range) instead of the kind's")
    args = parser.parse_args()
    class_name, fields = KINDS[args.kind]
    if args.std is not None:
        fields = {**fields, "initializer_range": args.std}
    config = getattr(transformers, class_name)(**fields)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    scales = SCALES.get(args.kind, {})
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rpartition(".")[2] in scales:
                module.weight.mul_(scales[name.rpartition(".")[2]])
    args.out.mkdir(parents=True, exist_ok=True)
    # Stored as its Hub checkpoint is: the as-loaded baseline (dtype="auto") then runs in that dtype.
    model.to(SAVED_DTYPE.get(args.kind, torch.float32)).save_pretrained(args.out)
    tokenizer_from = weights_folder(resolve_model("smollm2-135m"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, args.out / name)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {class_name}, {params / 1e6:.1f} M parameters, SmolLM2's tokenizer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
