"""The engine's model: HF LLaMA weights in decoder layers grouped into segments, each run (or compiled) as one unit."""
from __future__ import annotations

import torch
import torch._dynamo
from torch import nn

from autotune.engine.kv_cache import PagedKVCache
from autotune.engine.layers import DecoderLayer, StepInputs, rms_norm

__all__ = ["EngineModel", "Segment"]


class Segment(nn.Module):
    """A run of consecutive decoder layers: the unit that one compiled graph covers."""

    def __init__(self, layers: list[DecoderLayer], first_layer: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.first_layer = first_layer

    def forward(self, x: torch.Tensor, step: StepInputs, k_pools: list[torch.Tensor],
                v_pools: list[torch.Tensor]) -> torch.Tensor:
        for layer, k_pool, v_pool in zip(self.layers, k_pools, v_pools):
            x = layer(x, step, k_pool, v_pool)
        return x

    # Prefill and decode enter through their own functions so that, compiled, each has its own graphs and
    # shape history: prefill shapes vary with the prompts, decode shapes never do (the batch is padded).
    def prefill(self, x: torch.Tensor, step: StepInputs, k_pools: list[torch.Tensor],
                v_pools: list[torch.Tensor]) -> torch.Tensor:
        return self.forward(x, step, k_pools, v_pools)

    def decode(self, x: torch.Tensor, step: StepInputs, k_pools: list[torch.Tensor],
               v_pools: list[torch.Tensor]) -> torch.Tensor:
        return self.forward(x, step, k_pools, v_pools)


class EngineModel(nn.Module):
    """LLaMA forward over a paged KV cache. Built from a transformers LlamaForCausalLM (fp32) and a dtype."""

    def __init__(self, hf_model: nn.Module, dtype: torch.dtype, layers_per_segment: int | None = None) -> None:
        super().__init__()
        cfg = hf_model.config
        self.dtype = dtype
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_layers = cfg.num_hidden_layers
        self.eps = cfg.rms_norm_eps
        eos = cfg.eos_token_id
        self.eos_token_id: int | None = eos[0] if isinstance(eos, list) else eos
        inner = hf_model.model
        self.embed = nn.Embedding.from_pretrained(inner.embed_tokens.weight.detach().to(dtype), freeze=True)
        self.final_norm = nn.Parameter(inner.norm.weight.detach().to(dtype), requires_grad=False)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        self.lm_head.weight = (self.embed.weight if cfg.tie_word_embeddings
                               else nn.Parameter(hf_model.lm_head.weight.detach().to(dtype), requires_grad=False))
        layers = [self._convert_layer(hf_layer, cfg, dtype) for hf_layer in inner.layers]
        size = layers_per_segment or len(layers)
        self.segments = nn.ModuleList(Segment(layers[i:i + size], i) for i in range(0, len(layers), size))
        rope = cfg.rope_parameters if hasattr(cfg, "rope_parameters") else {"rope_theta": cfg.rope_theta}
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"rope_type {rope['rope_type']!r} is not supported by the engine yet")
        # Same arithmetic as transformers' default rotary embedding: fp32 tables, cast to the compute dtype.
        inv_freq = 1.0 / (rope["rope_theta"] ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        freqs = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_table", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin_table", emb.sin().to(dtype), persistent=False)
        self.requires_grad_(False)

    def _convert_layer(self, hf_layer: nn.Module, cfg, dtype: torch.dtype) -> DecoderLayer:
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        layer = DecoderLayer(cfg.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                             cfg.intermediate_size, cfg.rms_norm_eps).to(dtype)
        with torch.no_grad():
            layer.input_norm.copy_(hf_layer.input_layernorm.weight)
            layer.post_norm.copy_(hf_layer.post_attention_layernorm.weight)
            layer.qkv_proj.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
            layer.o_proj.weight.copy_(attn.o_proj.weight)
            layer.gate_up_proj.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            layer.down_proj.weight.copy_(mlp.down_proj.weight)
        return layer

    def new_cache(self, *, page_size: int, policy: str, max_seq_len: int, max_batch: int,
                  pool_tokens: int | None = None) -> PagedKVCache:
        return PagedKVCache(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                            page_size=page_size, policy=policy, max_seq_len=max_seq_len, max_batch=max_batch,
                            dtype=self.dtype, pool_tokens=pool_tokens, device=self.cos_table.device)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_table[positions].unsqueeze(-2), self.sin_table[positions].unsqueeze(-2)

    def _layers(self, x: torch.Tensor, step: StepInputs, cache: PagedKVCache) -> torch.Tensor:
        for pool in (*cache.k_pools, *cache.v_pools):
            # on_demand pools grow: one graph for every pool size rather than one per growth.
            torch._dynamo.maybe_mark_dynamic(pool, 1)
        for seg in self.segments:
            end = seg.first_layer + len(seg.layers)
            run = seg.prefill if step.prefill else seg.decode
            x = run(x, step, cache.k_pools[seg.first_layer:end], cache.v_pools[seg.first_layer:end])
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> fp32 logits [..., vocab]. Compiled with the segments when fused."""
        return self.lm_head(rms_norm(x, self.final_norm, self.eps)).float()

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
                all_logits: bool = False) -> torch.Tensor:
        """Prompts from position 0: token_ids, slots [seqs, seq_len], right-padded; lengths [seqs].

        Returns logits [seqs, seq_len, vocab] when all_logits (on the host: they are scored there), else each
        prompt's last position's [seqs, vocab]."""
        # The runner builds its inputs on the host; on an accelerator they move to the weights (no-op on the CPU).
        device = self.cos_table.device
        token_ids, slots, lengths = token_ids.to(device), slots.to(device), lengths.to(device)
        positions = torch.arange(token_ids.shape[1], device=device).expand_as(token_ids)
        cos, sin = self._rope(positions)
        x = self.embed(token_ids)
        for t in (x, cos, sin, slots):
            # Prompt count and length vary: one graph for all of them, not one per shape.
            torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(t, 1)
        x = self._layers(x, StepInputs(prefill=True, cos=cos, sin=sin, slots=slots), self._cache)
        if not all_logits:
            x = x[torch.arange(x.shape[0], device=device), lengths - 1]
            return self.logits(x)
        return self.logits(x).cpu()

    @torch.inference_mode()
    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_table: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
        """One token per row: token_ids, positions, slots [batch]; returns logits [batch, vocab]."""
        device = self.cos_table.device  # host-built step inputs move to the weights (no-op on the CPU)
        token_ids, positions, slots, block_table, context_mask = (
            t.to(device) for t in (token_ids, positions, slots, block_table, context_mask))
        cos, sin = self._rope(positions)
        step = StepInputs(prefill=False, cos=cos, sin=sin, slots=slots, block_table=block_table,
                          context_mask=context_mask)
        return self.logits(self._layers(self.embed(token_ids), step, self._cache))

    def attach(self, cache: PagedKVCache) -> None:
        self._cache = cache
