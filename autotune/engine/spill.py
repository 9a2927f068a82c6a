"""O2's eager weights out of memory. Inductor freezing folds each graph's weights into it as constants, most of them
prepacked copies for oneDNN, so after compiling the eager parameters are a second, unused copy of the weights
(measured on SmolLM2: docs/how-it-works.md, "O2 and memory"). They cannot simply be deleted: every new graph (a
prefill shape that does not fit the dynamic one, another batch size, a new runner) is traced and frozen again from
them. So they move to a read-only, file-backed private mapping of an unlinked file: the OS reads a page back when a
compile touches it, and at the end of each compile the pages are dropped again. Nothing writes to them (a write
would fault: the mapping is read-only), so a dropped page always reads back the same bytes. (torch._dynamo.reset()
clears dynamo's callbacks, this one too: pages read by later compiles then stay, the results are the same.)"""
from __future__ import annotations

import mmap
import os
import tempfile
import warnings
import weakref
from pathlib import Path

import torch
import torch._dynamo
from torch import nn

from autotune.paths import cache_root

__all__ = ["SpilledParameters", "spill_parameters"]

_ALIGN = 64  # bytes: every dtype's alignment, and a cache line


class SpilledParameters:
    """The parameters of `model` (plain CPU tensors; quantized tensor subclasses stay where they are) moved into
    one mapping. `drop()` releases the pages a compile read back; it runs after every dynamo compile."""

    def __init__(self, model: nn.Module, folder: Path | None = None) -> None:
        params: dict[int, nn.Parameter] = {}
        for p in model.parameters():  # tied weights (embedding and head) are one Parameter: moved once
            if type(p.data) is torch.Tensor and p.device.type == "cpu" and p.is_contiguous() and p.numel():
                params.setdefault(id(p), p)
        offsets, size = [], 0
        for p in params.values():
            offsets.append(size)
            size += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
        self.nbytes, self.count = size, len(params)
        self.address = 0  # where the mapping starts
        self._mm: mmap.mmap | None = None
        if not size:
            return
        folder = folder or cache_root() / "spill"
        folder.mkdir(parents=True, exist_ok=True)
        # On the disk, never in /tmp: a tmpfs file would hold the weights in memory still, only not in this process.
        fd, name = tempfile.mkstemp(prefix="weights-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                for p, offset in zip(params.values(), offsets):
                    fh.seek(offset)
                    fh.write(p.detach().reshape(-1).view(torch.uint8).numpy())
                fh.truncate(size)
            with open(name, "rb") as fh:
                self._mm = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        finally:
            os.unlink(name)  # the mapping keeps the file's blocks until it is closed
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            # One storage per parameter, not views of one: to dynamo, views of a common base are aliased inputs.
            for p, offset in zip(params.values(), offsets):
                p.data = torch.frombuffer(self._mm, dtype=p.dtype, count=p.numel(), offset=offset).view(p.shape)
        self.address = next(iter(params.values())).data_ptr()  # the first sits at offset 0
        self.drop()
        ref = weakref.ref(self)

        def after_compile(_args) -> None:
            # Not removed when the engine is gone: dynamo is iterating its list of callbacks as this runs.
            spilled = ref()
            if spilled is not None:
                spilled.drop()

        torch._dynamo.callback_handler.register_end_callback(after_compile)

    def drop(self) -> None:
        """Release the resident pages; the next read of a parameter faults them back in from the file."""
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_DONTNEED)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s memory lies in the mapping."""
        return self._mm is not None and self.address <= tensor.data_ptr() < self.address + self.nbytes

    def resident_bytes(self) -> int:
        """How much of the mapping is in memory now (the kernel's count in /proc/self/smaps)."""
        if self._mm is None:
            return 0
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            start, _, end = line.partition(" ")[0].partition("-")
            if end and all(c in "0123456789abcdef" for c in start + end) and \
                    int(start, 16) <= self.address < int(end, 16):
                rss = next(ln for ln in lines[i + 1:] if ln.startswith("Rss:"))
                return int(rss.split()[1]) * 1024
        return 0


def spill_parameters(model: nn.Module) -> SpilledParameters:
    return SpilledParameters(model)
