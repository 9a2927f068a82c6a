"""What a device computes natively, as the probe found it: each precision (offered to the search or not, and why),
each quantized kernel (and whether the guide should order it last), the figures that decided, fastest first. The
space is restricted by it (`restrict_space`) and the study stores it whole (`to_dict`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from autotune.space.search_space import Dimension, SearchSpace

__all__ = ["Precision", "Kernel", "Capabilities", "restrict_space", "EMULATED_RATIO", "SLOW_KERNEL_RATIO"]

# A precision without native instructions is dropped when its decode-shaped matmul is this much slower than fp32
# (bf16 on an AVX2-only EPYC: 4.7x to 30x, by the oneDNN path torch takes); nearer than that, it is kept.
EMULATED_RATIO = 1.5
# A quantized kernel this much slower than the plain matmul of its precision is kept for its memory, but ordered
# last by the guide: on a machine without a fast path for it, every trial of it is a slow one.
SLOW_KERNEL_RATIO = 3.0


@dataclass(frozen=True, slots=True)
class Precision:
    """`native`: the device has instructions or units for it; `offered`: the search space keeps it; `why`: the
    reason, with the figure that decided. `decode_us`: one decode-shaped matmul (the CPU's microbenchmark)."""

    name: str
    native: bool
    offered: bool
    why: str
    decode_us: float | None = None


@dataclass(frozen=True, slots=True)
class Kernel:
    """A quantized scheme's linear layer at one precision: its decode-shaped matmul and how it compares with the
    plain matmul of that precision (`vs_plain`; > 1 is slower). `slow`: ordered last by the guide."""

    scheme: str
    dtype: str
    decode_us: float | None
    vs_plain: float | None
    slow: bool
    why: str

    @property
    def label(self) -> str:
        return f"{self.scheme}@{self.dtype}"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """`precisions` are ordered fastest first among the offered ones (the dropped ones last); `device` is "cpu",
    "cuda", "npu" or a simulated profile; `name` the CPU model, GPU or SoC; `figures` the raw measurements."""

    device: str
    name: str
    precisions: tuple[Precision, ...]
    kernels: tuple[Kernel, ...] = ()
    isa: str | None = None
    flags: tuple[str, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def offered(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.precisions if p.offered)

    @property
    def fastest(self) -> str:
        """The device's fastest plain precision: the second speed baseline runs in it, and it leads the space."""
        return self.offered[0]

    def precision(self, name: str) -> Precision | None:
        return next((p for p in self.precisions if p.name == name), None)

    def slow_kernels(self) -> dict[str, str]:
        return {k.label: k.why for k in self.kernels if k.slow}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Capabilities:
        return cls(**{**data, "precisions": tuple(Precision(**p) for p in data["precisions"]),
                      "kernels": tuple(Kernel(**k) for k in data.get("kernels", ())),
                      "flags": tuple(data.get("flags", ()))})


def restrict_space(space: SearchSpace, caps: Capabilities) -> SearchSpace:
    """The space with the precisions the device only emulates removed (each reason recorded in `dropped`), the rest
    ordered fastest first (so that a baseline of `dtype: fastest` is the first), and the slow kernels noted for the
    guide (`ordered_last`)."""
    if "dtype" not in {d.name for d in space.dimensions}:
        # A space that names no precision computes in the device's fastest, not in a default it may only emulate.
        fixed = Dimension("dtype", (caps.fastest,), numerics=True)
        space = replace(space, dimensions=(fixed, *space.dimensions), dropped={
            **space.dropped, "dtype": f"fixed at {caps.fastest}, the device's fastest plain precision: the space file "
                                      "names no dtype"})
    values = space.dimension("dtype").values
    keep = tuple(name for name in caps.offered if name in values)
    removed = [p for p in caps.precisions if p.name in values and p.name not in keep]
    if removed:
        reason = "; ".join(f"{p.name}: {p.why}" for p in removed)
        space = space.restrict("dtype", keep, reason)
    if keep:
        space = space.reorder("dtype", keep)
    slow = {label: why for label, why in caps.slow_kernels().items() if label.split("@")[1] in keep}
    return space.note_ordered_last(slow) if slow else space
