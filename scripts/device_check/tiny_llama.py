"""Write a small random LLaMA as a Hugging Face folder (safetensors and a tokenizer), for the device check in place
of SmolLM2 (whose 98 MB GGUF would not travel with the working tree, and whose conversion needs gguf).

Usage: python tiny_llama.py FOLDER. SmolLM2's widths (hidden 576 with 9 heads of 64, 3 KV heads), so that the
int4 build needs SmolLM2's per-layer group sizes (576 takes groups of 64, 1536 of 128) and int8 GEMMs see its
shapes; 8 layers and a 2,048-token vocabulary keep it near 30 M parameters, built in seconds. The tokenizer is a
byte-level BPE trained here on the project's shipped text, so that the evaluation and prompt texts tokenize as
real text does. Weights are transformers' default initialisation: nearly flat outputs, which every build passes
the tie-aware gate on, so that each configuration is benchmarked (the check is of the device, not of accuracy)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 2048
SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train([str(p) for p in sorted((ROOT / "autotune" / "data").rglob("*.txt"))], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")


def model(vocab_size: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=576, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def main(folder: Path) -> int:
    tok = tokenizer()
    tok.save_pretrained(folder)
    model(len(tok)).save_pretrained(folder)
    print(f"  tiny LLaMA (8 layers, hidden 576, vocabulary {len(tok)}) in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
