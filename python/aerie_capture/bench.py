"""Throughput of the Python shard writer against the disk: `python -m aerie_capture.bench
--dir DIR`. Pushes synthetic samples shaped like Kimi-K2.5's capture (3 aux layers × 7168, bf16,
plus the teacher) through `ShardWriter` — checks, encoding, the safetensors write, fsync, rename,
sha256, manifest — and writes the same number of bytes with plain `write` + `fsync` for the
disk's own rate. Prints one JSON line. Nothing here is a timed test; run it on the target disk."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

from .shards import Metadata, ShardWriter, Teacher


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--tokens", type=int, default=16384, help="tokens to write in all")
    p.add_argument("--sample-tokens", type=int, default=2048)
    p.add_argument("--shard-tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--teacher", default="topk:64")
    p.add_argument("--no-checksums", action="store_true")
    a = p.parse_args()
    root = Path(a.dir)
    out = root / "bench-shards"
    shutil.rmtree(out, ignore_errors=True)
    teacher = Teacher.parse(a.teacher)
    md = Metadata("bench", 61, 163840, list(range(1, 1 + a.layers)), "output-of-layer", a.hidden, a.dtype, "0" * 64, "none", teacher, "aerie-capture bench")
    t = a.sample_tokens
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(t, a.layers * a.hidden, generator=g).to(torch.bfloat16)
    final = torch.randn(t, a.hidden, generator=g).to(torch.bfloat16) if teacher.final_hidden else None
    tid = tlp = None
    if teacher.topk:
        tid = torch.randint(0, 163840, (t, teacher.topk), generator=g, dtype=torch.int32)
        tlp = -torch.rand(t, teacher.topk, generator=g).cumsum(-1)
    ids = torch.randint(0, 163840, (t,), generator=g)
    mask = torch.ones(t, dtype=torch.uint8)
    w = ShardWriter.create(out, md, a.shard_tokens, checksums=not a.no_checksums)
    n = a.tokens // t
    t0 = time.perf_counter()
    for i in range(n):
        w.push(ids, mask, aux, final, tid, tlp, sample_id=i)
    w.finish()
    secs = time.perf_counter() - t0
    nbytes = sum(f.stat().st_size for f in out.iterdir() if f.name.startswith("shard-"))
    shutil.rmtree(out)

    raw = root / "bench-raw.bin"
    block = os.urandom(1 << 24)
    t0 = time.perf_counter()
    with open(raw, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[: min(left, len(block))])
        f.flush()
        os.fsync(f.fileno())
    disk = time.perf_counter() - t0
    raw.unlink()
    print(json.dumps({
        "tokens": n * t, "bytes": nbytes, "bytes_per_token": nbytes / (n * t), "checksums": not a.no_checksums,
        "writer_seconds": secs, "writer_mb_per_s": nbytes / secs / 1e6, "disk_seconds": disk, "disk_mb_per_s": nbytes / disk / 1e6,
        "writer_tokens_per_s": n * t / secs,
    }))


if __name__ == "__main__":
    main()
