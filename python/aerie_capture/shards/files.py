"""The files of a dataset: safetensors serialisation in the libraries' layout with sorted metadata
keys, atomic commits with fsyncs, the writer's directory lock, and the manifest (§5, §7)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..encodings import FORMAT_V1 as FORMAT, FORMAT_V2
from .metadata import LOCK_FILE, LockedError, MANIFEST_FILE, Metadata, ShardError, TMP_PREFIX, check_format_holds, format_is_supported

ST_DTYPES = {
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
    order = sorted(chunks, key=lambda k: (-_ST_ORDER.index(ST_DTYPES[first[k].dtype]), k))
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
        header[name] = {"dtype": ST_DTYPES[parts[0].dtype], "shape": shape if len(parts) > 1 or parts[0].dim() else [], "data_offsets": [offset, offset + n]}
        offset += n
        blobs.extend(c.reshape(-1).view(torch.uint8).numpy() for c in parts if c.numel())
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(memoryview(b))


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: Path, final: Path) -> None:
    """fsync `tmp`, rename it over `final`, fsync the directory (docs/shard-format.md §7)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    fsync_dir(final.parent)


def fresh_tmp(tmp: Path) -> None:
    """Make way for aerie's temp file `tmp` (created next with O_EXCL, as `open(.., "xb")` does,
    which never follows a link): a stale regular file of a killed run is removed; a symbolic link
    planted there is refused, its target untouched (docs/reliability.md)."""
    if tmp.is_symlink():
        raise ShardError(f"{tmp}: is a symbolic link where aerie writes a file of its own; aerie never writes through a link (its target is left as it is): remove the link")
    if tmp.is_file():
        tmp.unlink()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.parent / (TMP_PREFIX + path.name)
    fresh_tmp(tmp)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        commit(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class DirLock:
    """The writer lock on `dir/.aerie-shard.lock`; the file stays behind (deleting it would let
    two writers lock different inodes of one name)."""

    def __init__(self, d: Path):
        self.path = d / LOCK_FILE
        # Never through a link planted at the name (O_NOFOLLOW: ELOOP), as the Rust writer.
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ShardError(f"{self.path}: is a symbolic link where aerie writes a file of its own; aerie never writes through a link (its target is left as it is): remove the link") from None
            raise
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LockedError(f"{self.path}: another writer holds this dataset's lock") from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            # File systems without locks: go on unprotected rather than refuse (as Rust does).
            self.fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)

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
        write_bytes_atomic(d / MANIFEST_FILE, self.to_bytes())

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
        check_format_holds(fmt, md.encoding, str(path))
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
