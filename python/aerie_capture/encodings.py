"""Storage encodings of `aux_hidden` and `final_hidden` (the `dtype` metadata key).

One table, so a new encoding is one entry: its metadata spelling, the safetensors element type
it is stored as, and how a float tensor becomes that storage (and back, for readers and tests).
Today's encodings are the plain float types of docs/shard-format.md §3; every one rounds from
f32 with round-to-nearest-even (as the Rust writer's `half` conversions do), and a value that is
not finite after conversion (a NaN from the engine, an overflow of the f16 range) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Encoding:
    """How hidden states are stored under one `dtype` metadata value."""

    name: str
    """The `dtype` metadata spelling (`bf16`)."""
    storage: torch.dtype
    """The tensor dtype handed to safetensors (it names the file's element type)."""
    encode: Callable[[torch.Tensor], torch.Tensor]
    """Float rows [T, W] (any float dtype) → storage tensor [T, W] (contiguous, CPU)."""
    decode: Callable[[torch.Tensor], torch.Tensor]
    """Storage tensor → f32 rows."""

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.storage).element_size()


def _cast(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    def encode(t: torch.Tensor) -> torch.Tensor:
        # Rounding goes through f32 when the source is wider or differently laid out, so the
        # result equals the Rust writer's f32 → half rounding bit for bit.
        if t.dtype != dtype and t.dtype != torch.float32:
            t = t.float()
        return t.to(dtype).contiguous()

    return encode


def _to_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float()


ENCODINGS: dict[str, Encoding] = {
    e.name: e
    for e in (
        Encoding("bf16", torch.bfloat16, _cast(torch.bfloat16), _to_f32),
        Encoding("f16", torch.float16, _cast(torch.float16), _to_f32),
        Encoding("f32", torch.float32, _cast(torch.float32), _to_f32),
    )
}


def encoding(name: str) -> Encoding:
    """The encoding called `name`, or a ValueError listing the known ones."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise ValueError(f"unknown dtype `{name}` (known: {', '.join(ENCODINGS)})") from None


def encode_finite(enc: Encoding, rows: torch.Tensor, tensor: str) -> torch.Tensor:
    """Encode `rows` and refuse a value that is not finite once stored, naming its position."""
    out = enc.encode(rows.detach().cpu())
    if out.numel() == 0:
        return out
    # Fast path: max and min propagate NaN and are ±inf when any value is, and they run an order
    # of magnitude faster than an elementwise isfinite on a [T, 21504] bf16 block.
    if bool(torch.isfinite(out.amax())) and bool(torch.isfinite(out.amin())):
        return out
    bad = ~torch.isfinite(enc.decode(out))
    if bool(bad.any()):
        t, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{tensor}[{t}, {j}] is not finite as {enc.name}")
    return out
