"""aerie's prepared dataset (`aerie data prepare`: `report.json` plus one parquet file per
split with `input_ids list<int32>`, `loss_mask list<uint8>`, `source_id`, `sample_id int64`),
read in file order: the same deterministic order `aerie capture` walks, so a resumed capture
skips exactly the first `samples` inputs, and either engine's dataset lines up sample by sample
with the native one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

PREPARED_FORMAT = "aerie-prepared/1"


@dataclass
class PreparedSample:
    input_ids: list[int]
    loss_mask: list[int]
    source_id: str
    sample_id: int


class PreparedDataset:
    def __init__(self, d: Path | str):
        self.dir = Path(d)
        path = self.dir / "report.json"
        try:
            self.report = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path}: not found: {self.dir} is not a prepared dataset (`aerie data prepare`)") from None
        if self.report.get("format") != PREPARED_FORMAT:
            raise ValueError(f"{path}: format `{self.report.get('format')}` is not {PREPARED_FORMAT}")

    @property
    def vocab_size(self) -> int:
        return int(self.report["vocab_size"])

    @property
    def max_length(self) -> Optional[int]:
        """The longest sample `aerie data prepare` kept (`--max-length`), when it set one."""
        v = self.report.get("max_length")
        return int(v) if v else None

    @property
    def template(self) -> str:
        return self.report["template"]

    def len(self, split: str) -> int:
        return int(self.report["splits"].get(split, {}).get("samples", 0))

    def split_path(self, split: str) -> Path:
        splits = self.report["splits"]
        if split not in splits:
            raise ValueError(f"{self.dir}: no split `{split}` (splits: {', '.join(splits)})")
        return self.dir / splits[split]["file"]

    def samples(self, split: str, limit: Optional[int] = None) -> Iterator[PreparedSample]:
        import pyarrow.parquet as pq

        path = self.split_path(split)
        f = pq.ParquetFile(path)
        names = set(f.schema_arrow.names)
        for col in ("input_ids", "loss_mask", "source_id", "sample_id"):
            if col not in names:
                raise ValueError(f"{path}: no column `{col}`")
        n = 0
        for batch in f.iter_batches(batch_size=1024, columns=["input_ids", "loss_mask", "source_id", "sample_id"]):
            cols = batch.to_pydict()
            for ids, mask, src, sid in zip(cols["input_ids"], cols["loss_mask"], cols["source_id"], cols["sample_id"]):
                if limit is not None and n >= limit:
                    return
                if len(ids) != len(mask):
                    raise ValueError(f"{path}: sample #{n}: {len(ids)} input_ids but {len(mask)} loss_mask values")
                yield PreparedSample(ids, mask, src, sid)
                n += 1


def token_budget_batches(samples: Iterator[PreparedSample], max_batch_tokens: int, max_batch_samples: int) -> Iterator[list[PreparedSample]]:
    """Consecutive samples, packed until the next one would pass `max_batch_tokens` tokens or
    `max_batch_samples` samples (a longer sample gets a batch of its own). Order is kept, so the
    shards hold the samples in input order whatever the budget."""
    batch: list[PreparedSample] = []
    tokens = 0
    for s in samples:
        if batch and (tokens + len(s.input_ids) > max_batch_tokens or len(batch) >= max_batch_samples):
            yield batch
            batch, tokens = [], 0
        batch.append(s)
        tokens += len(s.input_ids)
    if batch:
        yield batch
