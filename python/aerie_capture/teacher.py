"""The exact top-k teacher of docs/shard-format.md §3: the K most likely next tokens and their
log-probabilities under a log-softmax over the **full** vocabulary.

On one device it is `log_softmax` then `topk`. Under tensor parallelism the head is split by
vocabulary rows, so each rank holds logits for its slice only: each takes its local top-K and its
local logsumexp, the small results are gathered, and the merge is exact because
`logsumexp(all) = logsumexp(local logsumexps)` and the global top-K is contained in the union of
the local top-Ks. These functions are pure (torch only) so the merge is tested on a CPU against a
full log-softmax, without SGLang.
"""

from __future__ import annotations

import torch


def topk_full(logits: torch.Tensor, k: int, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, V] logits → (ids [T, K] int32, logprobs [T, K] f32), in f32, `chunk` rows at a time
    (a [T, V] f32 copy of a 160k vocabulary would otherwise cost 640 KB per token)."""
    ids, lps = [], []
    for part in logits.split(chunk):
        lp = torch.log_softmax(part.float(), dim=-1)
        v, i = lp.topk(k, dim=-1)
        ids.append(i.to(torch.int32))
        lps.append(v)
    return torch.cat(ids), torch.cat(lps)


def shard_topk(logits: torch.Tensor, k: int, vocab_start: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One vocabulary shard's part: logits [T, Vs] for global ids `vocab_start..vocab_start+Vs`,
    of which ids ≥ `vocab_size` are padding (SGLang pads the vocab-parallel head) and are masked
    out. Returns (values [T, k'] f32 raw logits, global ids [T, k'] int64, logsumexp [T] f32),
    k' = min(k, real ids in the shard)."""
    x = logits.float()
    real = max(0, min(x.shape[-1], vocab_size - vocab_start))
    x = x[:, :real]
    lse = torch.logsumexp(x, dim=-1) if real > 0 else torch.full((x.shape[0],), float("-inf"))
    kk = min(k, real)
    v, i = x.topk(kk, dim=-1)
    return v, i.to(torch.int64) + vocab_start, lse


def merge_topk(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge `shard_topk` results of every shard (any order) into the global top-K:
    (ids [T, K] int32, logprobs [T, K] f32)."""
    values = torch.cat([p[0] for p in parts], dim=-1)
    ids = torch.cat([p[1] for p in parts], dim=-1)
    lse = torch.logsumexp(torch.stack([p[2] for p in parts], dim=-1), dim=-1)
    if values.shape[-1] < k:
        raise ValueError(f"top-{k} asked but the shards hold only {values.shape[-1]} candidates")
    v, j = values.topk(k, dim=-1)
    return ids.gather(-1, j).to(torch.int32), v - lse[:, None]
