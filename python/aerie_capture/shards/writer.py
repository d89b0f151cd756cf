"""Writing a dataset: shards cut as the Rust writer cuts them, committed atomically, resumable
after a crash (§7)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..encodings import encode_finite
from .metadata import AUX_HIDDEN, AUX_SCALES, FINAL_HIDDEN, FINAL_SCALES, INPUT_IDS, LOSS_MASK, MANIFEST_FILE, Metadata, SAMPLE_IDS, SAMPLE_OFFSETS, SCALES, ShardError, TMP_PREFIX, TOPK_IDS, TOPK_LOGPROBS, is_shard_file_name, sha256_file, shard_file_name
from .files import DirLock, Manifest, ShardEntry, commit, fresh_tmp, fsync_dir, write_safetensors
from .reader import ShardDataset, check_logprobs

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
                fsync_dir(d)
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
                check_logprobs("sample", tlp)
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
        fresh_tmp(tmp)
        try:
            write_safetensors(tmp, tensors, self.metadata.to_map())
            commit(tmp, path)
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
