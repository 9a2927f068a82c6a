"""A GGUF of a tiny transformers LLaMA, written with the gguf package as llama.cpp's convert_hf_to_gguf.py lays one
out (q and k rows permuted to llama.cpp's rotary layout), carrying SmolLM2's tokenizer (copied from the shipped
GGUF) so that llama.cpp loads it and real text tokenizes as the folder's tokenizer.json does."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _rotary_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' q/k rows (each head's rotary halves) -> llama.cpp's (interleaved pairs), as the converter."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _copy_tokenizer(writer, source: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(source)
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                values = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                values = [int(f.parts[i][0]) for i in f.data]
            writer.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, bytes(f.parts[f.data[0]]).decode())
        elif kind == gguf.GGUFValueType.BOOL:
            writer.add_bool(key, bool(f.parts[f.data[0]][0]))
        else:
            writer.add_uint32(key, int(f.parts[f.data[0]][0]))


def write_gguf(model, path: Path, tokenizer_gguf: Path, *, permute: bool = True) -> Path:
    """`model`: a transformers LlamaForCausalLM in fp32, written as an all-F32 GGUF. `permute=False` leaves q and
    k in transformers' layout: a wrong conversion, whose rotary embedding llama.cpp then applies to the wrong pairs."""
    import gguf

    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    rope_theta = getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _copy_tokenizer(writer, tokenizer_gguf)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if permute:
            q, k = _rotary_rows(q, c.num_attention_heads), _rotary_rows(k, c.num_key_value_heads)
        for name, tensor in ((f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"]),
                             (f"blk.{i}.attn_q.weight", q), (f"blk.{i}.attn_k.weight", k),
                             (f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"]),
                             (f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
                             (f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
                             (f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]),
                             (f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"]),
                             (f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])):
            writer.add_tensor(name, np.ascontiguousarray(tensor))
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        writer.add_tensor("output.weight", sd["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
