"""Reading a dataset back with the checks of docs/shard-format.md §6."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch
from safetensors import safe_open

from .metadata import AUX_HIDDEN, AUX_SCALES, FINAL_HIDDEN, FINAL_SCALES, INPUT_IDS, LOGPROB_SLACK, LOSS_MASK, MANIFEST_FILE, Metadata, SAMPLE_IDS, SAMPLE_OFFSETS, SCALES, ShardError, TOPK_IDS, TOPK_LOGPROBS, sha256_file
from .files import Manifest, ShardEntry, ST_DTYPES

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
        stored = ST_DTYPES[enc.storage]
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
                check_logprobs(str(path), ts[TOPK_LOGPROBS].float())
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


def check_logprobs(where: str, lp: torch.Tensor) -> None:
    bad = torch.isnan(lp) | (lp > LOGPROB_SLACK)
    if bool(bad.any()):
        t, j = (int(v) for v in bad.nonzero()[0])
        raise ShardError(f"{where}: teacher_topk_logprobs[{t}, {j}] = {float(lp[t, j])} is not a log-probability")
    rising = lp[:, 1:] > lp[:, :-1]
    if bool(rising.any()):
        t, j = (int(v) for v in rising.nonzero()[0])
        raise ShardError(f"{where}: teacher_topk_logprobs row {t} is not descending ({float(lp[t, j])} then {float(lp[t, j + 1])} at {j})")
