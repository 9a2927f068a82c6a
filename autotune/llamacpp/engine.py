"""llama.cpp through llama-cpp-python's low-level API: the model loaded once, and contexts made from it with one
configuration's knobs. A context runs requests as llama-server's slots do (continuous batching: up to `batch_size`
sequences, each step's decode tokens first, then prompt chunks, up to n_batch tokens per llama_decode call,
greedy choices from the logits), or returns every position's logits of one sequence (the gate's windows)."""
from __future__ import annotations

import ctypes
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotune.config.deploy import DeployConfig
from autotune.engine.sequence import Completion, Request  # the engine's: one request and completion type for both
from autotune.errors import TrialFailure

__all__ = ["LlamaCppModel", "LlamaCppContext"]


def _lib():
    import llama_cpp
    from llama_cpp._logger import set_verbose

    set_verbose(False)  # llama.cpp's load and context logs go to stderr unless asked; errors still do
    return llama_cpp


class LlamaCppModel:
    """The weights of one GGUF file (memory-mapped, as llama-server loads them)."""

    def __init__(self, path: Path) -> None:
        lc = _lib()
        lc.llama_backend_init()
        self.path = path
        self.handle = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
        if not self.handle:
            raise TrialFailure(f"llama.cpp could not load {path}")
        vocab = lc.llama_model_get_vocab(self.handle)
        self.n_vocab = lc.llama_vocab_n_tokens(vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self.handle)
        # Masked until a request has all its tokens, as transformers' min_new_tokens does for the reference and
        # the workload's requests do (end-of-sequence is ignored).
        self.end_ids = sorted({t for t in (lc.llama_vocab_eos(vocab), lc.llama_vocab_eot(vocab)) if t >= 0})

    def context(self, config: DeployConfig, threads: int) -> LlamaCppContext:
        return LlamaCppContext(self, config, threads)

    def close(self) -> None:
        if self.handle:
            _lib().llama_model_free(self.handle)
            self.handle = None


_FLASH = {"on": "LLAMA_FLASH_ATTN_TYPE_ENABLED", "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
          "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO"}
_KV = {"f16": "GGML_TYPE_F16", "q8_0": "GGML_TYPE_Q8_0"}


@dataclass(slots=True)
class _Slot:
    index: int  # the request's position in the run
    pending: list[int]  # prompt tokens not yet decoded
    pos: int = 0
    next_token: int = -1  # the token the next decode step feeds; -1 while the prompt is pending


class LlamaCppContext:
    """One llama_context: its KV cache (n_ctx tokens, unified over `batch_size` sequences, as llama-server's default
    --parallel sets up), batch sizes, flash attention and KV type, and `threads` threads for prompt and decode."""

    def __init__(self, model: LlamaCppModel, config: DeployConfig, threads: int) -> None:
        lc = _lib()
        self.model, self.config, self.threads = model, config, threads
        params = lc.llama_context_default_params()
        params.n_ctx = config.n_ctx or model.n_ctx_train
        params.n_batch, params.n_ubatch = config.n_batch, config.n_ubatch
        params.n_seq_max = config.batch_size
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = getattr(lc, _FLASH[config.flash_attn])
        params.type_k = params.type_v = getattr(lc, _KV[config.kv_type])
        params.kv_unified = True
        params.no_perf = True
        self.handle = lc.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise TrialFailure(f"llama.cpp could not make a context for {config.label()}")
        self.n_ctx = lc.llama_n_ctx(self.handle)
        self._batch = lc.llama_batch_init(config.n_batch, 0, 1)
        self._lc = lc

    def close(self) -> None:
        if self.handle:
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self.handle)
            self.handle = None

    def _clear(self) -> None:
        self._lc.llama_memory_clear(self._lc.llama_get_memory(self.handle), True)

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence, whether its logits are wanted)."""
        b = self._batch
        for i, (token, pos, seq, wanted) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, wanted
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        code = self._lc.llama_decode(self.handle, b)
        if code != 0:
            why = "no KV cache room: raise n_ctx" if code == 1 else "error"
            raise TrialFailure(f"llama_decode returned {code} ({why}) for {self.config.label()}")

    def _logits(self, i: int) -> np.ndarray:
        ptr = self._lc.llama_get_logits_ith(self.handle, i)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.model.n_vocab,))

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        """Teacher-forced logits of one sequence at every position: [len(tokens), vocab] float32."""
        self._clear()
        out = np.empty((len(tokens), self.model.n_vocab), dtype=np.float32)
        step = self.config.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            self._decode([(t, start + i, 0, True) for i, t in enumerate(chunk)])
            for i in range(len(chunk)):
                out[start + i] = self._logits(i)
        return out

    def run(self, requests: list[Request]) -> list[Completion]:
        """Every request to its last token, `batch_size` at a time, a waiting one taking the first free sequence."""
        if any(r.min_new_tokens != r.max_new_tokens for r in requests):
            raise ValueError("llama.cpp's runner produces exactly max_new_tokens (end-of-sequence is masked): give "
                             "every request min_new_tokens == max_new_tokens")
        longest = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
        if longest * min(self.config.batch_size, len(requests)) > self.n_ctx:
            raise TrialFailure(f"n_ctx {self.n_ctx} cannot hold {min(self.config.batch_size, len(requests))} sequences "
                               f"of up to {longest} tokens")
        self._clear()
        start = time.perf_counter()
        done = [Completion(r, arrival=start) for r in requests]
        waiting = deque(range(len(requests)))
        free = list(range(self.config.batch_size))[::-1]
        active: dict[int, _Slot] = {}
        mask = self.model.end_ids
        while waiting or active:
            while waiting and free:
                i = waiting.popleft()
                active[free.pop()] = _Slot(i, list(requests[i].prompt_ids))
            entries: list[tuple[int, int, int, bool]] = []
            outputs: list[int] = []  # the sequence of each entry whose logits are wanted, in batch order
            for seq, slot in active.items():  # decode steps first, as llama-server's update_slots does
                if slot.next_token >= 0:
                    entries.append((slot.next_token, slot.pos, seq, True))
                    outputs.append(seq)
                    slot.pos += 1
            for seq, slot in active.items():  # then prompt chunks, while the batch has room
                room = self.config.n_batch - len(entries)
                if slot.next_token >= 0 or room <= 0:
                    continue
                take, slot.pending = slot.pending[:room], slot.pending[room:]
                for k, token in enumerate(take):
                    last = not slot.pending and k == len(take) - 1
                    entries.append((token, slot.pos + k, seq, last))
                    if last:
                        outputs.append(seq)
                slot.pos += len(take)
            self._decode(entries)
            now = time.perf_counter()
            wanted = [i for i, e in enumerate(entries) if e[3]]
            for i, seq in zip(wanted, outputs):
                slot = active[seq]
                completion = done[slot.index]
                logits = self._logits(i)
                if mask:
                    logits = logits.copy()
                    logits[mask] = -np.inf
                greedy = int(logits.argmax())
                request = completion.request
                k = len(completion.output_ids)
                token = request.forced_ids[k] if k < len(request.forced_ids) else greedy
                completion.greedy_ids.append(greedy)
                completion.output_ids.append(token)
                completion.token_times.append(now)
                if len(completion.output_ids) == request.max_new_tokens:
                    self._lc.llama_memory_seq_rm(self._lc.llama_get_memory(self.handle), seq, -1, -1)
                    del active[seq]
                    free.append(seq)
                else:
                    slot.next_token = token
        return done
