"""A paged KV cache: per-layer page pools, a block table per sequence, and a policy for reserving pages."""
from __future__ import annotations

import math

import torch

from autotune.config.deploy import KV_POLICIES

__all__ = ["PagedKVCache", "OutOfPages"]


# Page 0 is never handed out: padded batch rows write their throw-away K/V there.
_SCRATCH_PAGE = 0


class OutOfPages(RuntimeError):
    """The pool policy has no free page left: the scheduler must wait for a sequence to finish."""


class PagedKVCache:
    """K and V of every layer stored in pages of `page_size` tokens.

    Policies decide what memory is reserved:
    - preallocate: a sequence reserves pages for `max_seq_len` tokens when it is admitted;
    - on_demand: a sequence takes a page only when its tokens reach it, and the pools grow as needed;
    - pool: pools sized once for `pool_tokens` tokens in all, never grown; a sequence reserves the pages of its
      own maximum length (prompt + new tokens) when admitted, and waits while the pool cannot hold them.
    Pools: k_pools[layer], v_pools[layer]: [num_kv_heads, num_pages, page_size, head_dim]; heads outermost so that
    a gather of a batch's pages is one contiguous [kv_heads * batch, context, head_dim] operand for attention.
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, page_size: int, policy: str,
                 max_seq_len: int, max_batch: int, dtype: torch.dtype, pool_tokens: int | None = None,
                 device: torch.device | str = "cpu") -> None:
        if policy not in KV_POLICIES:
            raise ValueError(f"kv_policy must be one of {KV_POLICIES}, not {policy!r}")
        self.page_size = page_size
        self.policy = policy
        self.max_seq_len = max_seq_len
        self.pages_per_seq = math.ceil(max_seq_len / page_size)
        self._shape = (num_kv_heads, head_dim)
        self._num_layers = num_layers
        self._dtype = dtype
        self._device = device  # where the pools live: the model's device (accelerator backends)
        if policy == "pool":
            capacity = 1 + max(math.ceil((pool_tokens or max_batch * max_seq_len) / page_size), self.pages_per_seq)
        elif policy == "preallocate":
            capacity = 1 + max_batch * self.pages_per_seq
        else:
            capacity = 1 + max_batch
        self.k_pools: list[torch.Tensor] = []
        self.v_pools: list[torch.Tensor] = []
        self._free: list[int] = []
        self._resize(capacity)
        self._pages: dict[int, list[int]] = {}
        self.peak_pages_in_use = 0

    @property
    def num_pages(self) -> int:
        return self.k_pools[0].shape[1]

    @property
    def pages_in_use(self) -> int:
        return sum(len(p) for p in self._pages.values())

    @property
    def reserved_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (*self.k_pools, *self.v_pools))

    def _resize(self, capacity: int) -> None:
        old = self.num_pages if self.k_pools else 0
        heads, head_dim = self._shape
        shape = (heads, capacity, self.page_size, head_dim)
        for pools in (self.k_pools, self.v_pools):
            for i in range(self._num_layers):
                grown = torch.zeros(shape, dtype=self._dtype, device=self._device)
                if old:
                    grown[:, :old] = pools[i]
                    pools[i] = grown
                else:
                    pools.append(grown)
        first = max(old, _SCRATCH_PAGE + 1)
        self._free.extend(range(capacity - 1, first - 1, -1))

    def _take_page(self) -> int:
        if not self._free:
            if self.policy == "pool":
                raise OutOfPages("the KV page pool is exhausted")
            # Grow by half again, so that growing costs amortised O(1) per page.
            self._resize(self.num_pages + max(1, self.num_pages // 2))
        return self._free.pop()

    def pages_for(self, num_tokens: int) -> int:
        """The pages that hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    def pages_to_admit(self, max_tokens: int) -> int:
        """Free pages a sequence that may reach `max_tokens` tokens must find to be admitted (pool policy only:
        the others take pages as they go, growing the pools if need be)."""
        return self.pages_for(max_tokens) if self.policy == "pool" else 0

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def usable_pages(self) -> int:
        return self.num_pages - 1  # the scratch page is never handed out

    def allocate(self, seq_id: int, num_tokens: int, max_tokens: int | None = None) -> None:
        """Reserve pages for a new sequence whose first `num_tokens` tokens are about to be written and which
        may grow to `max_tokens`."""
        assert seq_id not in self._pages
        if self.policy == "preallocate":
            count = self.pages_per_seq
        elif self.policy == "pool":
            count = self.pages_for(max(num_tokens, max_tokens or 0))
        else:
            count = self.pages_for(num_tokens)
        self._pages[seq_id] = [self._take_page() for _ in range(count)]
        self.peak_pages_in_use = max(self.peak_pages_in_use, self.pages_in_use)

    def extend(self, seq_id: int, num_tokens: int) -> bool:
        """Make room for `num_tokens` tokens in all; True when a page was added (the block table changed)."""
        pages = self._pages[seq_id]
        if num_tokens > len(pages) * self.page_size:
            if num_tokens > self.max_seq_len:
                raise ValueError(f"sequence of {num_tokens} tokens exceeds max_seq_len {self.max_seq_len}")
            pages.append(self._take_page())
            self.peak_pages_in_use = max(self.peak_pages_in_use, self.pages_in_use)
            return True
        return False

    def free(self, seq_id: int) -> None:
        self._free.extend(reversed(self._pages.pop(seq_id)))

    def block_row(self, seq_id: int) -> list[int]:
        """The sequence's pages, padded to `pages_per_seq` with the scratch page."""
        pages = self._pages[seq_id]
        return pages + [_SCRATCH_PAGE] * (self.pages_per_seq - len(pages))

    def slots(self, seq_id: int, start: int, end: int) -> torch.Tensor:
        """Flat slot indices (page * page_size + offset) of positions [start, end) of a sequence."""
        pages = torch.tensor(self._pages[seq_id], dtype=torch.long)
        pos = torch.arange(start, end)
        return pages[pos // self.page_size] * self.page_size + pos % self.page_size
