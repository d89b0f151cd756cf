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

from .metadata import AUX_HIDDEN, AUX_SCALES, FINAL_HIDDEN, FINAL_SCALES, INPUT_IDS, KEYS, LOCK_FILE, LOGPROB_SLACK, LOSS_MASK, LockedError, MANIFEST_FILE, Metadata, SAMPLE_IDS, SAMPLE_OFFSETS, SCALES, ShardError, TMP_PREFIX, TOPK_IDS, TOPK_LOGPROBS, Teacher, format_is_supported, format_major, is_shard_file_name, sha256_file, shard_file_name
from .files import DirLock, Manifest, ShardEntry, write_safetensors
from .reader import Sample, ShardDataset
from .writer import ResumeInfo, ShardWriter

__all__ = [
    "AUX_HIDDEN",
    "AUX_SCALES",
    "FINAL_HIDDEN",
    "FINAL_SCALES",
    "INPUT_IDS",
    "KEYS",
    "LOCK_FILE",
    "LOGPROB_SLACK",
    "LOSS_MASK",
    "LockedError",
    "MANIFEST_FILE",
    "Metadata",
    "SAMPLE_IDS",
    "SAMPLE_OFFSETS",
    "SCALES",
    "ShardError",
    "TMP_PREFIX",
    "TOPK_IDS",
    "TOPK_LOGPROBS",
    "Teacher",
    "format_is_supported",
    "format_major",
    "is_shard_file_name",
    "sha256_file",
    "shard_file_name",
    "DirLock",
    "Manifest",
    "ShardEntry",
    "write_safetensors",
    "Sample",
    "ShardDataset",
    "ResumeInfo",
    "ShardWriter",
]
