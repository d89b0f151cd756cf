"""The shard format's names, the dataset errors, and the metadata of §4 with its teacher."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from ..encodings import FORMAT_V1 as FORMAT, FORMAT_V2, Encoding, encoding

MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".aerie-shard.lock"
TMP_PREFIX = ".tmp-"
# Log-probs may exceed 0 by this much (rounding in the engine's log-softmax); as the Rust checks.
LOGPROB_SLACK = 1e-3

KEYS = (
    "format",
    "target",
    "target_num_layers",
    "target_vocab_size",
    "aux_layer_ids",
    "aux_convention",
    "hidden_size",
    "dtype",
    "tokenizer_digest",
    "chat_template",
    "teacher",
    "created_by",
)

INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
SAMPLE_OFFSETS = "sample_offsets"
AUX_HIDDEN = "aux_hidden"
FINAL_HIDDEN = "final_hidden"
AUX_SCALES = "aux_hidden_scales"
FINAL_SCALES = "final_hidden_scales"
SCALES = {AUX_HIDDEN: AUX_SCALES, FINAL_HIDDEN: FINAL_SCALES}
TOPK_IDS = "teacher_topk_ids"
TOPK_LOGPROBS = "teacher_topk_logprobs"
SAMPLE_IDS = "sample_ids"


class ShardError(Exception):
    """A problem with a dataset; the message names the file and what is wrong."""


class LockedError(ShardError):
    """Another writer holds the dataset's lock."""


def shard_file_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


_SHARD_NAME = re.compile(r"^shard-\d+\.safetensors$")


def is_shard_file_name(name: str) -> bool:
    return bool(_SHARD_NAME.match(name))


def format_major(fmt: str) -> Optional[int]:
    if not fmt.startswith("aerie-shard/"):
        return None
    major = fmt[len("aerie-shard/") :].split(".", 1)[0]
    return int(major) if major.isdigit() else None


def format_is_supported(fmt: str) -> bool:
    return format_major(fmt) in (1, 2)


def check_format_holds(fmt: str, enc: Encoding, where: str) -> None:
    """A scaled encoding under format 1 would be misread by a format-1 reader as plain values."""
    if enc.scaled and format_major(fmt) == 1:
        raise ShardError(f"{where}: `format` is {fmt} but the dtype `{enc.name}` needs {enc.format}")


def sha256_file(path: os.PathLike | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Teacher and metadata


@dataclass(frozen=True)
class Teacher:
    """`final-hidden`, `topk:K` or `final-hidden+topk:K`."""

    final_hidden: bool
    topk: Optional[int]

    @staticmethod
    def parse(s: str) -> "Teacher":
        final, topk = False, None
        parts = s.split("+")
        if len(parts) > 2 or not s:
            raise ValueError(f"teacher `{s}`: expected final-hidden, topk:K or final-hidden+topk:K")
        for i, part in enumerate(parts):
            if part == "final-hidden" and i == 0:
                final = True
            elif part.startswith("topk:") and i == len(parts) - 1:
                k = part[5:]
                if not k.isdigit() or str(int(k)) != k:
                    raise ValueError(f"teacher `{s}`: K `{k}` is not a canonical decimal")
                topk = int(k)
            else:
                raise ValueError(f"teacher `{s}`: expected final-hidden, topk:K or final-hidden+topk:K")
        return Teacher(final, topk)

    def __str__(self) -> str:
        parts = (["final-hidden"] if self.final_hidden else []) + ([f"topk:{self.topk}"] if self.topk else [])
        return "+".join(parts)


@dataclass
class Metadata:
    """The dataset metadata of docs/shard-format.md §4 (`ShardMetadata` in Rust)."""

    target: str
    target_num_layers: int
    target_vocab_size: int
    aux_layer_ids: list[int]
    aux_convention: str
    hidden_size: int
    dtype: str
    tokenizer_digest: str
    chat_template: str
    teacher: Teacher
    created_by: str
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def aux_width(self) -> int:
        return len(self.aux_layer_ids) * self.hidden_size

    @property
    def encoding(self) -> Encoding:
        return encoding(self.dtype)

    @property
    def group(self) -> int:
        """Values per scale of a scaled encoding (0 for the plain floats)."""
        return self.encoding.group(self.hidden_size)

    def bytes_per_token(self) -> int:
        enc = self.encoding
        n = 4 + 1 + enc.row_bytes(self.aux_width, self.hidden_size)
        if self.teacher.final_hidden:
            n += enc.row_bytes(self.hidden_size, self.hidden_size)
        if self.teacher.topk:
            n += self.teacher.topk * 8
        return n

    def validate(self) -> None:
        def bad(key: str, message: str) -> ShardError:
            return ShardError(f"metadata `{key}`: {message}")

        if not self.target:
            raise bad("target", "is empty")
        if self.target_num_layers <= 0:
            raise bad("target_num_layers", "must be positive")
        if not 1 <= self.target_vocab_size <= 2**31:
            raise bad("target_vocab_size", "must be in 1..=2^31")
        ids = self.aux_layer_ids
        if not ids:
            raise bad("aux_layer_ids", "is empty")
        if any(b <= a for a, b in zip(ids, ids[1:])) or any(i < 0 for i in ids):
            raise bad("aux_layer_ids", f"{ids} is not strictly increasing (low → high)")
        if ids[-1] >= self.target_num_layers:
            raise bad("aux_layer_ids", f"layer {ids[-1]} does not exist in a target with {self.target_num_layers} layers")
        if self.aux_convention not in ("output-of-layer", "input-of-layer"):
            raise bad("aux_convention", f"`{self.aux_convention}` is neither output-of-layer nor input-of-layer")
        if self.hidden_size <= 0:
            raise bad("hidden_size", "must be positive")
        try:
            enc = encoding(self.dtype)
        except ValueError as e:
            raise bad("dtype", str(e)) from None
        if enc.scaled and self.hidden_size % enc.group(self.hidden_size):
            g = enc.group(self.hidden_size)
            raise bad("dtype", f"{enc.name} stores a scale per {g} values of a layer, so hidden_size must be a multiple of {g} (it is {self.hidden_size})")
        if not re.fullmatch(r"[0-9a-f]{64}", self.tokenizer_digest):
            raise bad("tokenizer_digest", f"`{self.tokenizer_digest}` is not a lowercase hex sha256")
        if not self.chat_template:
            raise bad("chat_template", "is empty (write `none` for raw text)")
        if not self.teacher.final_hidden and not self.teacher.topk:
            raise bad("teacher", "is empty")
        if self.teacher.topk is not None and not 1 <= self.teacher.topk <= self.target_vocab_size:
            raise bad("teacher", f"K = {self.teacher.topk} is outside 1..=target_vocab_size")
        for key in self.extra:
            if key in KEYS:
                raise bad(key, "standard key given again in `extra`")

    def to_map(self) -> dict[str, str]:
        m = dict(self.extra)
        m.update(
            {
                "format": encoding(self.dtype).format,
                "target": self.target,
                "target_num_layers": str(self.target_num_layers),
                "target_vocab_size": str(self.target_vocab_size),
                # serde_json's compact spelling, as the Rust writer stores it.
                "aux_layer_ids": json.dumps(self.aux_layer_ids, separators=(",", ":")),
                "aux_convention": self.aux_convention,
                "hidden_size": str(self.hidden_size),
                "dtype": self.dtype,
                "tokenizer_digest": self.tokenizer_digest,
                "chat_template": self.chat_template,
                "teacher": str(self.teacher),
                "created_by": self.created_by,
            }
        )
        return dict(sorted(m.items()))

    @staticmethod
    def from_map(m: dict[str, str], where: str = "metadata") -> "Metadata":
        def get(key: str) -> str:
            if key not in m:
                raise ShardError(f"{where}: metadata `{key}` is missing")
            return m[key]

        def number(key: str) -> int:
            v = get(key)
            if not v.isdigit():
                raise ShardError(f"{where}: metadata `{key}`: `{v}` is not an integer")
            return int(v)

        fmt = get("format")
        if not format_is_supported(fmt):
            raise ShardError(f"{where}: metadata `format`: `{fmt}` is not {FORMAT} or {FORMAT_V2}")
        try:
            ids = json.loads(get("aux_layer_ids"))
            assert isinstance(ids, list) and all(isinstance(i, int) and i >= 0 for i in ids)
        except (ValueError, AssertionError):
            raise ShardError(f"{where}: metadata `aux_layer_ids`: `{m['aux_layer_ids']}` is not a JSON list of layer ids") from None
        try:
            teacher = Teacher.parse(get("teacher"))
        except ValueError as e:
            raise ShardError(f"{where}: metadata `teacher`: {e}") from None
        md = Metadata(
            target=get("target"),
            target_num_layers=number("target_num_layers"),
            target_vocab_size=number("target_vocab_size"),
            aux_layer_ids=ids,
            aux_convention=get("aux_convention"),
            hidden_size=number("hidden_size"),
            dtype=get("dtype"),
            tokenizer_digest=get("tokenizer_digest"),
            chat_template=get("chat_template"),
            teacher=teacher,
            created_by=get("created_by"),
            extra={k: v for k, v in m.items() if k not in KEYS},
        )
        try:
            md.validate()
        except ShardError as e:
            raise ShardError(f"{where}: {e}") from None
        check_format_holds(fmt, md.encoding, f"{where}: metadata")
        return md

    def differences(self, other: "Metadata", ignore: tuple[str, ...] = ()) -> list[str]:
        """Keys on which the two disagree, compared in canonical form, one line each."""
        a, b = self.to_map(), other.to_map()
        out = []
        for k in sorted(set(a) | set(b)):
            if k in ignore:
                continue
            if a.get(k) != b.get(k):
                out.append(f"{k}: `{a.get(k, '(absent)')}` vs `{b.get(k, '(absent)')}`")
        return out
