"""aerie-shard/1 and /2 in Python: the writer a capture engine feeds and a reader that checks what
docs/shard-format.md §6 asks, both following the format exactly as the Rust reference
(`crates/aerie-data/src/shard/`) does, so that either side reads what the other writes.

- Metadata (§4): every standard key, validated like `ShardMetadata::validate`, compared
  semantically (`[1, 2]` equals `[1,2]`, `format` by major version only).
- Writing (§7): an empty manifest at creation; each shard as `.tmp-<name>`, fsynced, renamed,
  directory fsynced; then the manifest the same way. Shards are cut as the Rust writer cuts them
  (a sample that would take the open shard past `shard_tokens` starts a new one, a shard that
  reaches it closes), so the same inputs give the same shard boundaries in either language.
- One writer per directory: `fcntl.flock(LOCK_EX | LOCK_NB)` on `.aerie-shard.lock`, the same
  lock the Rust writer takes (`File::try_lock` is flock on Linux).
- Resume: temp files and unlisted shard files are deleted, listed shards are opened and checked,
  and the done sample count and ids are reported.
- Encodings (§3, §3.1): the plain floats (format 1) and the scaled fp8-e4m3 and int4 (format 2,
  each hidden tensor with its `_scales`), encoded as the Rust writer encodes them.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch
from safetensors import safe_open

from .encodings import FORMAT_V1 as FORMAT, FORMAT_V2, Encoding, encode_finite, encoding

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


def _check_format_holds(fmt: str, enc: Encoding, where: str) -> None:
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
        _check_format_holds(fmt, md.encoding, f"{where}: metadata")
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


# ---------------------------------------------------------------------------------------------
# Files

_ST_DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
}

# The safetensors `Dtype` enum's order (Rust crate 0.6): the library sorts tensors by it
# (descending), then by name, which puts every wider element type before every narrower one.
_ST_ORDER = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
]


def write_safetensors(path: Path, tensors: dict[str, "torch.Tensor | list[torch.Tensor]"], metadata: dict[str, str]) -> None:
    """Write a safetensors file with the layout the `safetensors` libraries produce (header
    padded to 8 bytes, tensors ordered by element type, widest first, then by name, so each is
    aligned to its element size), but with the metadata keys sorted: the safetensors core
    serialises them from a hash map in a per-process random order, and a resumed capture must
    give byte-identical shards. A tensor may be given as a list of chunks along its first axis
    (the writer's per-sample parts): they are streamed from their own memory one after the
    other, without the concatenated copy of the shard that `torch.cat` + `safetensors.torch.save`
    would make."""
    if sys.byteorder != "little":
        raise RuntimeError("aerie-shard/1 is little-endian; this host is not")
    chunks = {k: [v] if isinstance(v, torch.Tensor) else list(v) for k, v in tensors.items()}
    first = {k: v[0] for k, v in chunks.items()}
    order = sorted(chunks, key=lambda k: (-_ST_ORDER.index(_ST_DTYPES[first[k].dtype]), k))
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    blobs = []
    for name in order:
        parts = [c.detach().cpu().contiguous() for c in chunks[name]]
        shape = list(parts[0].shape)
        shape[0] = sum(c.shape[0] for c in parts) if shape else 0
        if any(c.dtype != parts[0].dtype or list(c.shape[1:]) != shape[1:] for c in parts):
            raise ValueError(f"{path}: {name}: chunks of different dtypes or widths")
        n = sum(c.numel() * c.element_size() for c in parts)
        header[name] = {"dtype": _ST_DTYPES[parts[0].dtype], "shape": shape if len(parts) > 1 or parts[0].dim() else [], "data_offsets": [offset, offset + n]}
        offset += n
        blobs.extend(c.reshape(-1).view(torch.uint8).numpy() for c in parts if c.numel())
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(memoryview(b))


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: Path, final: Path) -> None:
    """fsync `tmp`, rename it over `final`, fsync the directory (docs/shard-format.md §7)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(final.parent)


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.parent / (TMP_PREFIX + path.name)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        _commit(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class DirLock:
    """The writer lock on `dir/.aerie-shard.lock`; the file stays behind (deleting it would let
    two writers lock different inodes of one name)."""

    def __init__(self, d: Path):
        self.path = d / LOCK_FILE
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LockedError(f"{self.path}: another writer holds this dataset's lock") from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            # File systems without locks: go on unprotected rather than refuse (as Rust does).
            self.fd = os.open(self.path, os.O_WRONLY)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class ShardEntry:
    file: str
    samples: int
    tokens: int
    masked_tokens: int
    sha256: Optional[str] = None

    def to_json(self) -> dict:
        d = {"file": self.file, "samples": self.samples, "tokens": self.tokens, "masked_tokens": self.masked_tokens}
        if self.sha256 is not None:
            d["sha256"] = self.sha256
        return d


@dataclass
class Manifest:
    shards: list[ShardEntry]
    metadata: Metadata

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def to_bytes(self) -> bytes:
        doc = {
            "format": self.metadata.encoding.format,
            "shards": [s.to_json() for s in self.shards],
            "samples": self.samples,
            "tokens": self.tokens,
            "metadata": self.metadata.to_map(),
        }
        return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()

    def write(self, d: Path) -> None:
        _write_bytes_atomic(d / MANIFEST_FILE, self.to_bytes())

    @staticmethod
    def read(d: Path) -> "Manifest":
        path = d / MANIFEST_FILE
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ShardError(f"{path}: not found: {d} is not a capture shard directory") from None
        except ValueError as e:
            raise ShardError(f"{path}: not valid JSON: {e}") from None
        fmt = doc.get("format")
        if not isinstance(fmt, str):
            raise ShardError(f"{path}: no `format` string")
        if not format_is_supported(fmt):
            raise ShardError(f"{path}: format `{fmt}` is not supported (this reader reads {FORMAT} and {FORMAT_V2})")
        md = Metadata.from_map(doc.get("metadata") or {}, str(path))
        _check_format_holds(fmt, md.encoding, str(path))
        shards, seen = [], set()
        for i, e in enumerate(doc.get("shards", [])):
            entry = ShardEntry(e["file"], int(e["samples"]), int(e["tokens"]), int(e["masked_tokens"]), e.get("sha256"))
            name = entry.file
            if not name or "/" in name or "\\" in name or name in (".", "..", MANIFEST_FILE) or name.startswith(TMP_PREFIX):
                raise ShardError(f"{path}: shards[{i}]: `{name}` is not a plain file name")
            if name in seen:
                raise ShardError(f"{path}: shards[{i}]: `{name}` is listed twice")
            seen.add(name)
            if entry.samples == 0 or entry.tokens < entry.samples or entry.masked_tokens > entry.tokens:
                raise ShardError(f"{path}: shards[{i}]: `{name}` has inconsistent counts {e}")
            shards.append(entry)
        m = Manifest(shards, md)
        if m.samples != doc.get("samples") or m.tokens != doc.get("tokens"):
            raise ShardError(
                f"{path}: totals say {doc.get('samples')} samples / {doc.get('tokens')} tokens "
                f"but the shards add up to {m.samples} / {m.tokens}"
            )
        return m


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class Sample:
    """One sample read back: tensors on the CPU, hidden states decoded to f32."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux_hidden: torch.Tensor
    final_hidden: Optional[torch.Tensor]
    topk_ids: Optional[torch.Tensor]
    topk_logprobs: Optional[torch.Tensor]
    sample_id: Optional[int]


class ShardDataset:
    """A dataset opened with the header-level checks of docs/shard-format.md §6 (1-4);
    `verify()` adds the full value checks. Shard files are read whole on demand."""

    def __init__(self, d: os.PathLike | str):
        self.dir = Path(d)
        self.manifest = Manifest.read(self.dir)
        self.metadata = self.manifest.metadata
        self._ids_present: Optional[bool] = None
        logprob_dtypes = set()
        for entry in self.manifest.shards:
            path = self.dir / entry.file
            if not path.is_file():
                raise ShardError(f"{path}: listed in {MANIFEST_FILE} but missing")
            with safe_open(path, framework="pt") as f:
                md = Metadata.from_map(f.metadata() or {}, str(path))
                diff = md.differences(self.metadata)
                if diff:
                    raise ShardError(f"{path}: metadata disagrees with {MANIFEST_FILE}: {'; '.join(diff)}")
                self._check_header(path, entry, f)
                has_ids = SAMPLE_IDS in f.keys()
                if self._ids_present is None:
                    self._ids_present = has_ids
                elif self._ids_present != has_ids:
                    raise ShardError(f"{path}: sample_ids present in some shards and not in others")
                if TOPK_LOGPROBS in f.keys():
                    logprob_dtypes.add(f.get_slice(TOPK_LOGPROBS).get_dtype())
        if len(logprob_dtypes) > 1:
            raise ShardError(f"{self.dir}: teacher_topk_logprobs has several dtypes {sorted(logprob_dtypes)}")

    def _check_header(self, path: Path, entry: ShardEntry, f) -> None:
        m = self.metadata
        t, n = entry.tokens, entry.samples
        enc = m.encoding
        stored = _ST_DTYPES[enc.storage]
        want = {
            INPUT_IDS: ("I32", [t]),
            LOSS_MASK: ("U8", [t]),
            SAMPLE_OFFSETS: ("I64", [n + 1]),
            AUX_HIDDEN: (stored, [t, m.aux_width // enc.per_element]),
        }
        if m.teacher.final_hidden:
            want[FINAL_HIDDEN] = (stored, [t, m.hidden_size // enc.per_element])
        if enc.scaled:
            for name, width in ((AUX_HIDDEN, m.aux_width), (FINAL_HIDDEN, m.hidden_size)):
                if name in want:
                    want[SCALES[name]] = ("F32", [t, width // m.group])
        if m.teacher.topk:
            want[TOPK_IDS] = ("I32", [t, m.teacher.topk])
            want[TOPK_LOGPROBS] = (("F16", "F32"), [t, m.teacher.topk])
        keys = set(f.keys())
        for name in (FINAL_HIDDEN, TOPK_IDS, TOPK_LOGPROBS):
            if name in keys and name not in want:
                raise ShardError(f"{path}: {name}: present but the teacher is `{m.teacher}`")
        for name in (AUX_SCALES, FINAL_SCALES):
            if name in keys and name not in want:
                raise ShardError(f"{path}: {name}: present but the dtype `{enc.name}` has no scales")
        if SAMPLE_IDS in keys:
            want[SAMPLE_IDS] = ("I64", [n])
        for name, (dtype, shape) in want.items():
            if name not in keys:
                raise ShardError(f"{path}: {name}: missing")
            s = f.get_slice(name)
            dt, sh = s.get_dtype(), list(s.get_shape())
            if (dt not in dtype) if isinstance(dtype, tuple) else (dt != dtype):
                raise ShardError(f"{path}: {name}: dtype {dt}, expected {dtype}")
            if sh != shape:
                raise ShardError(f"{path}: {name}: shape {sh}, expected {shape}")
        off = f.get_tensor(SAMPLE_OFFSETS)
        if int(off[0]) != 0 or int(off[-1]) != t or bool((off[1:] <= off[:-1]).any()):
            raise ShardError(f"{path}: sample_offsets: must start at 0, end at {t} and strictly increase")

    def __len__(self) -> int:
        return self.manifest.samples

    @property
    def has_sample_ids(self) -> bool:
        return bool(self._ids_present)

    def shard_tensors(self, entry: ShardEntry) -> dict[str, torch.Tensor]:
        with safe_open(self.dir / entry.file, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    def samples(self) -> Iterator[Sample]:
        for entry in self.manifest.shards:
            ts = self.shard_tensors(entry)
            off = ts[SAMPLE_OFFSETS].tolist()
            for i in range(entry.samples):
                a, b = off[i], off[i + 1]
                yield Sample(
                    input_ids=ts[INPUT_IDS][a:b],
                    loss_mask=ts[LOSS_MASK][a:b],
                    aux_hidden=self._decode(ts, AUX_HIDDEN, a, b),
                    final_hidden=self._decode(ts, FINAL_HIDDEN, a, b) if FINAL_HIDDEN in ts else None,
                    topk_ids=ts[TOPK_IDS][a:b] if TOPK_IDS in ts else None,
                    topk_logprobs=ts[TOPK_LOGPROBS][a:b].float() if TOPK_LOGPROBS in ts else None,
                    sample_id=int(ts[SAMPLE_IDS][i]) if SAMPLE_IDS in ts else None,
                )

    def _decode(self, ts: dict[str, torch.Tensor], name: str, a: int, b: int) -> torch.Tensor:
        scales = ts[SCALES[name]][a:b] if self.metadata.encoding.scaled else None
        return self.metadata.encoding.decode(ts[name][a:b], scales, self.metadata.group)

    def sample_ids(self) -> list[int]:
        out = []
        for entry in self.manifest.shards:
            with safe_open(self.dir / entry.file, framework="pt") as f:
                if SAMPLE_IDS in f.keys():
                    out.extend(f.get_tensor(SAMPLE_IDS).tolist())
        return out

    def verify(self) -> dict:
        """Every value (§6, full verification): sha256, masks, ids, log-probs, finiteness."""
        m = self.metadata
        ids_seen: set[int] = set()
        masked_total = 0
        for entry in self.manifest.shards:
            path = self.dir / entry.file
            if entry.sha256 is not None and sha256_file(path) != entry.sha256:
                raise ShardError(f"{path}: sha256 differs from {MANIFEST_FILE}")
            ts = self.shard_tensors(entry)
            mask = ts[LOSS_MASK]
            if bool((mask > 1).any()):
                raise ShardError(f"{path}: loss_mask: values other than 0/1")
            masked = int(mask.sum())
            if masked != entry.masked_tokens:
                raise ShardError(f"{path}: loss_mask has {masked} ones, {MANIFEST_FILE} says {entry.masked_tokens}")
            masked_total += masked
            _check_ids(path, INPUT_IDS, ts[INPUT_IDS], m.target_vocab_size)
            for name in (AUX_HIDDEN, FINAL_HIDDEN):
                if name not in ts:
                    continue
                if m.encoding.scaled:
                    sc = ts[SCALES[name]]
                    bad = ~(torch.isfinite(sc) & (sc > 0))
                    if bool(bad.any()):
                        r, g = (int(v) for v in bad.nonzero()[0])
                        raise ShardError(f"{path}: {SCALES[name]}[{r}, {g}] = {float(sc[r, g])}: a scale must be positive and finite")
                    values = m.encoding.decode(ts[name], sc, m.group)
                else:
                    values = ts[name].float()
                if not bool(torch.isfinite(values).all()):
                    r, j = (int(v) for v in (~torch.isfinite(values)).nonzero()[0])
                    raise ShardError(f"{path}: {name}[{r}, {j}]: non-finite value")
            if TOPK_IDS in ts:
                _check_ids(path, TOPK_IDS, ts[TOPK_IDS], m.target_vocab_size)
                _check_logprobs(str(path), ts[TOPK_LOGPROBS].float())
            if SAMPLE_IDS in ts:
                for sid in ts[SAMPLE_IDS].tolist():
                    if sid in ids_seen:
                        raise ShardError(f"{path}: sample_ids: id {sid} appears twice in the dataset")
                    ids_seen.add(sid)
        return {
            "shards": len(self.manifest.shards),
            "samples": self.manifest.samples,
            "tokens": self.manifest.tokens,
            "masked_tokens": masked_total,
        }


def _check_ids(path, name: str, ids: torch.Tensor, vocab: int) -> None:
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise ShardError(f"{path}: {name}[{i}] = {int(ids.flatten()[i])} is outside the target vocabulary 0..{vocab}")


def _check_logprobs(where: str, lp: torch.Tensor) -> None:
    bad = torch.isnan(lp) | (lp > LOGPROB_SLACK)
    if bool(bad.any()):
        t, j = (int(v) for v in bad.nonzero()[0])
        raise ShardError(f"{where}: teacher_topk_logprobs[{t}, {j}] = {float(lp[t, j])} is not a log-probability")
    rising = lp[:, 1:] > lp[:, :-1]
    if bool(rising.any()):
        t, j = (int(v) for v in rising.nonzero()[0])
        raise ShardError(f"{where}: teacher_topk_logprobs row {t} is not descending ({float(lp[t, j])} then {float(lp[t, j + 1])} at {j})")


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass
class ResumeInfo:
    shards: int
    samples: int
    tokens: int
    removed: list[Path]
    sample_ids: set[int]


class ShardWriter:
    """Appends samples to a dataset directory; call `finish()` at the end. Closing without
    `finish()` (or dying) loses the shard being filled, nothing else."""

    def __init__(self, d: Path, metadata: Metadata, manifest: Manifest, lock: DirLock, shard_tokens: int, checksums: bool, ids: set[int], with_ids: Optional[bool]):
        self.dir = d
        self.metadata = metadata
        self.manifest = manifest
        self._lock = lock
        self.shard_tokens = shard_tokens
        self.checksums = checksums
        self.ids = ids
        self.with_ids = with_ids
        self.next_shard = len(manifest.shards)
        listed = {s.file for s in manifest.shards}
        while shard_file_name(self.next_shard) in listed:
            self.next_shard += 1
        self._enc = metadata.encoding
        self._reset()

    def _reset(self) -> None:
        names = (INPUT_IDS, LOSS_MASK, AUX_HIDDEN, AUX_SCALES, FINAL_HIDDEN, FINAL_SCALES, TOPK_IDS, TOPK_LOGPROBS)
        self._parts: dict[str, list[torch.Tensor]] = {k: [] for k in names}
        self._offsets = [0]
        self._sample_ids: list[int] = []
        self._masked = 0

    # -- opening --

    @classmethod
    def create(cls, d: os.PathLike | str, metadata: Metadata, shard_tokens: int = 65536, checksums: bool = True) -> "ShardWriter":
        d = Path(d)
        if shard_tokens <= 0:
            raise ShardError("shard_tokens must be positive")
        metadata.validate()
        d.mkdir(parents=True, exist_ok=True)
        lock = DirLock(d)
        try:
            if (d / MANIFEST_FILE).exists() or any(is_shard_file_name(n) for n in os.listdir(d)):
                raise ShardError(f"{d}: already holds a shard dataset")
            manifest = Manifest([], metadata)
            manifest.write(d)
        except BaseException:
            lock.release()
            raise
        return cls(d, metadata, manifest, lock, shard_tokens, checksums, set(), None)

    @classmethod
    def resume(cls, d: os.PathLike | str, shard_tokens: int = 65536, checksums: bool = True) -> tuple["ShardWriter", ResumeInfo]:
        d = Path(d)
        if not (d / MANIFEST_FILE).exists():
            raise ShardError(f"{d / MANIFEST_FILE}: no shard dataset here")
        lock = DirLock(d)
        try:
            manifest = Manifest.read(d)
            listed = {s.file for s in manifest.shards}
            removed = []
            for name in sorted(os.listdir(d)):
                if name.startswith(TMP_PREFIX) or (is_shard_file_name(name) and name not in listed):
                    (d / name).unlink()
                    removed.append(d / name)
            if removed:
                _fsync_dir(d)
            ds = ShardDataset(d)
            ids = set(ds.sample_ids())
            with_ids = ds.has_sample_ids if len(ds) else None
        except BaseException:
            lock.release()
            raise
        info = ResumeInfo(len(manifest.shards), manifest.samples, manifest.tokens, removed, ids)
        return cls(d, ds.metadata, manifest, lock, shard_tokens, checksums, set(ids), with_ids), info

    @classmethod
    def open_or_create(cls, d: os.PathLike | str, metadata: Metadata, shard_tokens: int = 65536, checksums: bool = True) -> tuple["ShardWriter", Optional[ResumeInfo]]:
        """Resume `d` when it holds a dataset (its metadata must equal `metadata` except
        `created_by`, as the Rust writer requires), create it otherwise."""
        d = Path(d)
        if not (d / MANIFEST_FILE).exists():
            return cls.create(d, metadata, shard_tokens, checksums), None
        w, info = cls.resume(d, shard_tokens, checksums)
        diff = metadata.differences(w.metadata, ignore=("created_by",))
        if diff:
            w.close()
            raise ShardError(f"{d}: cannot resume, the requested metadata differs from {d / MANIFEST_FILE}: {'; '.join(diff)}")
        return w, info

    # -- appending --

    @property
    def samples_written(self) -> int:
        return self.manifest.samples + len(self._offsets) - 1

    @property
    def pending_tokens(self) -> int:
        return self._offsets[-1]

    def contains_sample_id(self, sid: int) -> bool:
        return sid in self.ids

    def push(
        self,
        input_ids,
        loss_mask,
        aux_hidden: torch.Tensor,
        final_hidden: Optional[torch.Tensor] = None,
        topk_ids: Optional[torch.Tensor] = None,
        topk_logprobs: Optional[torch.Tensor] = None,
        sample_id: Optional[int] = None,
    ) -> None:
        """Append one sample, checked entirely first (lengths, teacher tensors, ids in the
        vocabulary, a 0/1 mask, finite hidden values once stored, descending log-probs): a
        refused sample leaves no trace."""
        index = self.samples_written
        where = f"{self.dir}: sample #{index}" + (f" (id {sample_id})" if sample_id is not None else "")
        try:
            rec = self._check(input_ids, loss_mask, aux_hidden, final_hidden, topk_ids, topk_logprobs, sample_id)
        except ValueError as e:
            raise ShardError(f"{where}: {e}") from None
        t = rec[INPUT_IDS].numel()
        if self.pending_tokens > 0 and self.pending_tokens + t > self.shard_tokens:
            self.flush()
        for k, v in rec.items():
            self._parts[k].append(v)
        self._offsets.append(self._offsets[-1] + t)
        self._masked += int(rec[LOSS_MASK].sum())
        if sample_id is not None:
            self._sample_ids.append(int(sample_id))
            self.ids.add(int(sample_id))
        self.with_ids = sample_id is not None
        if self.pending_tokens >= self.shard_tokens:
            self.flush()

    def _check(self, input_ids, loss_mask, aux, final, topk_ids, topk_lp, sample_id) -> dict[str, torch.Tensor]:
        m = self.metadata
        ids = torch.as_tensor(input_ids).to(torch.int64).flatten()
        t = ids.numel()
        if t == 0:
            raise ValueError("has no tokens")
        mask = torch.as_tensor(loss_mask).flatten()
        if mask.numel() != t:
            raise ValueError(f"loss_mask has {mask.numel()} entries but input_ids has {t}")
        if bool(((mask != 0) & (mask != 1)).any()):
            i = int(((mask != 0) & (mask != 1)).nonzero()[0])
            raise ValueError(f"loss_mask[{i}] = {int(mask[i])} is neither 0 nor 1")
        bad = (ids < 0) | (ids >= m.target_vocab_size)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(f"input_ids[{i}] = {int(ids[i])} is outside the target vocabulary 0..{m.target_vocab_size}")

        rec = {INPUT_IDS: ids.to(torch.int32), LOSS_MASK: mask.to(torch.uint8)}

        def rows(name: str, x: torch.Tensor, width: int, why: str) -> None:
            if tuple(x.shape) != (t, width):
                raise ValueError(f"{name} has shape {list(x.shape)}, expected [{t}, {width}] ({why})")
            rec[name], scales = encode_finite(self._enc, x, name, m.group)
            if scales is not None:
                rec[SCALES[name]] = scales

        rows(AUX_HIDDEN, aux, m.aux_width, f"{len(m.aux_layer_ids)} layers × hidden_size {m.hidden_size}")
        if m.teacher.final_hidden != (final is not None):
            raise ValueError(f"final_hidden {'missing' if final is None else 'given'} (teacher `{m.teacher}`)")
        if final is not None:
            rows(FINAL_HIDDEN, final, m.hidden_size, "hidden_size")
        if bool(m.teacher.topk) != (topk_ids is not None) or (topk_ids is None) != (topk_lp is None):
            raise ValueError(f"top-k teacher {'missing' if topk_ids is None else 'given'} (teacher `{m.teacher}`)")
        if topk_ids is not None:
            k = m.teacher.topk
            tid = torch.as_tensor(topk_ids).cpu()
            tlp = torch.as_tensor(topk_lp).detach().cpu().float()
            for name, x in ((TOPK_IDS, tid), (TOPK_LOGPROBS, tlp)):
                if tuple(x.shape) != (t, k):
                    raise ValueError(f"{name} has shape {list(x.shape)}, expected [{t}, {k}] (teacher `{m.teacher}`)")
            badk = (tid < 0) | (tid >= m.target_vocab_size)
            if bool(badk.any()):
                r, j = (int(v) for v in badk.nonzero()[0])
                raise ValueError(f"teacher_topk_ids[{r}, {j}] = {int(tid[r, j])} is outside the target vocabulary")
            try:
                _check_logprobs("sample", tlp)
            except ShardError as e:
                raise ValueError(str(e).removeprefix("sample: ")) from None
            rec[TOPK_IDS] = tid.to(torch.int32).contiguous()
            rec[TOPK_LOGPROBS] = tlp.contiguous()
        if self.with_ids is True and sample_id is None:
            raise ValueError("has no sample_id but earlier samples do")
        if self.with_ids is False and sample_id is not None:
            raise ValueError("has a sample_id but earlier samples do not")
        if sample_id is not None and int(sample_id) in self.ids:
            raise ValueError(f"sample id {sample_id} was already written to this dataset")
        return rec

    def flush(self) -> None:
        """Close the shard being filled (if any): write it, then list it in the manifest."""
        n = len(self._offsets) - 1
        if n == 0:
            return
        name = shard_file_name(self.next_shard)
        path = self.dir / name
        tmp = self.dir / (TMP_PREFIX + name)
        t = self._offsets[-1]
        tensors: dict = {k: v for k, v in self._parts.items() if v}
        tensors[SAMPLE_OFFSETS] = torch.tensor(self._offsets, dtype=torch.int64)
        if self._sample_ids:
            tensors[SAMPLE_IDS] = torch.tensor(self._sample_ids, dtype=torch.int64)
        try:
            write_safetensors(tmp, tensors, self.metadata.to_map())
            _commit(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        sha = sha256_file(path) if self.checksums else None
        shards = self.manifest.shards + [ShardEntry(name, n, t, self._masked, sha)]
        manifest = Manifest(shards, self.metadata)
        # Until this rename lands the shard is unlisted: a crash here loses its samples (resume
        # deletes the file), never the dataset's consistency.
        manifest.write(self.dir)
        self.manifest = manifest
        self.next_shard += 1
        self._reset()

    def finish(self) -> Manifest:
        self.flush()
        self.manifest.write(self.dir)
        self.close()
        return self.manifest

    def close(self) -> None:
        """Release the lock; the shard being filled, if any, is discarded."""
        self._lock.release()
