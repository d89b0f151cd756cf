"""Storage encodings of `aux_hidden` and `final_hidden` (the `dtype` metadata key).

One table, so a new encoding is one entry: its metadata spelling, the safetensors element type
it is stored as, and how float rows become that storage (and back, for readers and tests).

- The plain float types of docs/shard-format.md §3 (format 1) round from f32 with
  round-to-nearest-even, as the Rust writer's `half` conversions do.
- The scaled encodings of §3.1 (format 2) store small codes and one f32 scale per group of a
  row's values (`<tensor>_scales` [T, G]); they are computed exactly as the Rust writer
  computes them (`crates/aerie-data/src/shard/encoding.rs`), in f32, so the same rows give the
  same bytes in either language (tested against `aerie shards convert`).

A value that is not finite (a NaN from the engine, an overflow of the f16 range) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

FORMAT_V1 = "aerie-shard/1"
"""The shard format of the plain float encodings."""
FORMAT_V2 = "aerie-shard/2"
"""The shard format of the scaled encodings (a format-1 reader would misread them)."""
FP8_E4M3_MAX = 448.0
"""The largest finite E4M3FN value."""
INT4_MAX = 7.0
"""Codes are −7..7 (nibble 0, code −8, is never written)."""
INT4_GROUP = 32
"""Values per scale of `int4`."""
_MIN_SCALE = 2.0**-126
"""f32's smallest normal: an all-zero group's scale (a stored 0 always means damage)."""


@dataclass(frozen=True)
class Encoding:
    """How hidden states are stored under one `dtype` metadata value."""

    name: str
    """The `dtype` metadata spelling (`bf16`, `fp8-e4m3`)."""
    storage: torch.dtype
    """The tensor dtype handed to safetensors (it names the file's element type)."""
    encode: Callable[[torch.Tensor, int], tuple[torch.Tensor, Optional[torch.Tensor]]]
    """Finite f32 rows [T, W] and the group size → (codes [T, W / per_element], scales [T, W /
    group] or None for the plain floats), contiguous, on the CPU."""
    decode: Callable[[torch.Tensor, Optional[torch.Tensor], int], torch.Tensor]
    """(codes, scales, group) → f32 rows [T, W]."""
    per_element: int = 1
    """Values per stored element (2 for `int4`: two nibbles per byte)."""
    scale_group: Optional[Callable[[int], int]] = None
    """Values per scale for a dataset of hidden size Ht; None for the plain floats."""

    @property
    def scaled(self) -> bool:
        return self.scale_group is not None

    @property
    def format(self) -> str:
        return FORMAT_V2 if self.scaled else FORMAT_V1

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.storage).element_size()

    def group(self, hidden_size: int) -> int:
        """Values per scale (the row width for the plain floats, which have none)."""
        return self.scale_group(hidden_size) if self.scale_group else 0

    def row_bytes(self, width: int, hidden_size: int) -> int:
        """Bytes of one stored row of `width` values, scales included."""
        n = width // self.per_element * self.element_size
        if self.scaled:
            n += 4 * (width // self.group(hidden_size))
        return n


def _cast(dtype: torch.dtype):
    def encode(t: torch.Tensor, group: int) -> tuple[torch.Tensor, None]:
        # Rounding goes through f32 when the source is wider or differently laid out, so the
        # result equals the Rust writer's f32 → half rounding bit for bit.
        if t.dtype != dtype and t.dtype != torch.float32:
            t = t.float()
        return t.to(dtype).contiguous(), None

    return encode


def _to_f32(codes: torch.Tensor, scales: Optional[torch.Tensor], group: int) -> torch.Tensor:
    return codes.float()


def _groups(t: torch.Tensor, group: int, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """f32 rows viewed as [T, G, group], and each group's scale: amax / qmax, floored at 2^-126."""
    rows, width = t.shape
    if width % group:
        raise ValueError(f"row width {width} is not a multiple of the group size {group}")
    g = t.float().reshape(rows, width // group, group)
    return g, torch.clamp(g.abs().amax(dim=2) / qmax, min=_MIN_SCALE)


def _scaled(codes: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """Code values (f32 rows [T, W]) times their groups' scales."""
    rows, width = codes.shape
    return (codes.reshape(rows, width // group, group) * scales.unsqueeze(2)).reshape(rows, width)


def _fp8_encode(t: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    g, scales = _groups(t, group, FP8_E4M3_MAX)
    # torch's f32 → E4M3FN cast rounds to nearest, ties to even, but gives NaN beyond the range
    # where the Rust encoder saturates: clamp first (|x| / scale can round to just above 448).
    q = (g / scales.unsqueeze(2)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return q.to(torch.float8_e4m3fn).reshape(t.shape).contiguous(), scales.contiguous()


def _fp8_decode(codes: torch.Tensor, scales: Optional[torch.Tensor], group: int) -> torch.Tensor:
    return _scaled(codes.float(), scales, group)


def _int4_encode(t: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    g, scales = _groups(t, group, INT4_MAX)
    # torch.round rounds half to even, as Rust's round_ties_even.
    q = (torch.round(g / scales.unsqueeze(2)).clamp(-INT4_MAX, INT4_MAX).to(torch.int16) + 8).to(torch.uint8)
    q = q.reshape(t.shape)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), scales.contiguous()


def _int4_decode(codes: torch.Tensor, scales: Optional[torch.Tensor], group: int) -> torch.Tensor:
    rows, half = codes.shape
    nib = torch.stack(((codes & 15), (codes >> 4)), dim=2).reshape(rows, 2 * half)
    return _scaled((nib.to(torch.int16) - 8).float(), scales, group)


ENCODINGS: dict[str, Encoding] = {
    e.name: e
    for e in (
        Encoding("bf16", torch.bfloat16, _cast(torch.bfloat16), _to_f32),
        Encoding("f16", torch.float16, _cast(torch.float16), _to_f32),
        Encoding("f32", torch.float32, _cast(torch.float32), _to_f32),
        # One scale per token and captured layer.
        Encoding("fp8-e4m3", torch.float8_e4m3fn, _fp8_encode, _fp8_decode, scale_group=lambda ht: ht),
        Encoding("int4", torch.uint8, _int4_encode, _int4_decode, per_element=2, scale_group=lambda ht: INT4_GROUP),
    )
}


def encoding(name: str) -> Encoding:
    """The encoding called `name`, or a ValueError listing the known ones."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise ValueError(f"unknown dtype `{name}` (known: {', '.join(ENCODINGS)})") from None


def _first_not_finite(x: torch.Tensor) -> Optional[tuple[int, int]]:
    """The position of the first value that is not finite, or None."""
    if x.numel() == 0:
        return None
    # Fast path: max and min propagate NaN and are ±inf when any value is, and they run an order
    # of magnitude faster than an elementwise isfinite on a [T, 21504] bf16 block.
    if bool(torch.isfinite(x.amax())) and bool(torch.isfinite(x.amin())):
        return None
    bad = ~torch.isfinite(x)
    if not bool(bad.any()):
        return None
    t, j = (int(v) for v in bad.nonzero()[0])
    return t, j


def encode_finite(enc: Encoding, rows: torch.Tensor, tensor: str, group: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Encode `rows` (groups of `group` values share a scale in the scaled encodings) and refuse
    a value that is not finite, in the input or once stored, naming its position."""
    rows = rows.detach().cpu()
    if enc.scaled:
        bad = _first_not_finite(rows)
        if bad:
            raise ValueError(f"{tensor}[{bad[0]}, {bad[1]}] is not finite")
        return enc.encode(rows, group)
    out, _ = enc.encode(rows, group)
    bad = _first_not_finite(out)
    if bad:
        raise ValueError(f"{tensor}[{bad[0]}, {bad[1]}] is not finite as {enc.name}")
    return out, None
