"""The capture loop and its command line (`python -m aerie_capture`, or under `torchrun` for the
SGLang engine; `aerie capture --engine transformers|sglang|vllm` launches it).

Every rank walks the prepared split in file order (the order `aerie capture` uses), packs
consecutive samples under a token budget, and runs the engine on each batch; rank 0 alone owns
the dataset (lock, resume, writes). Its writes run on a thread behind a queue of two batches, so
the copy to the host and the shard writes overlap the next forward pass. At the end rank 0
prints one JSON report on stdout (`WorkerReport` in crates/aerie-capture/src/python.rs reads
it); `aerie capture` then verifies the dataset with its own reader.

aerie hands the worker the shard metadata whole (`--metadata`): the aux layers, the target's
shape, the tokenizer digest, dtype and teacher are computed and checked once, in Rust
(crates/aerie-capture/src/contract.rs); the worker asserts only what its engine reports.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from . import __version__
from .contract import max_model_len, metadata_arg
from .data import PreparedDataset, token_budget_batches
from .engines import DTYPES, build_engine, missing_worker_modules
from .shards import Metadata, ShardWriter, Teacher
from .shards.files import DirLock

def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aerie_capture", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["transformers", "sglang", "vllm"], default="transformers")
    p.add_argument("--target", required=True, help="target model directory (HF layout)")
    p.add_argument("--metadata", help="the shard metadata as aerie computed it (a JSON object: the shard header's map, docs/shard-format.md §4); aux layers, dtype and teacher come from it")
    p.add_argument("--data", help="prepared dataset directory (`aerie data prepare`)")
    p.add_argument("--out", help="output shard directory; an interrupted capture there is resumed")
    p.add_argument("--split", default="train")
    p.add_argument("--shard-tokens", type=int, default=65536, help="tokens per shard (the writer holds one shard in memory)")
    p.add_argument("--max-samples", type=int, help="capture only the first N samples of the split")
    p.add_argument("--max-batch-tokens", type=int, default=32768, help="token budget of one forward batch (SGLang: packed, unpadded)")
    p.add_argument("--max-batch-samples", type=int, default=64)
    p.add_argument("--device", default="cpu", help="transformers engine: cpu or cuda:N; vllm engine: where the final norm and the teacher's head run")
    p.add_argument("--compute-dtype", choices=list(DTYPES), help="transformers and vllm engines: weights/activations (default f32 on cpu, bf16 on GPUs); sglang engine: its --dtype (default the target's)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--tp", type=int, default=1, help="sglang engine: tensor-parallel size (= torchrun --nproc-per-node); vllm engine: tensor_parallel_size")
    p.add_argument("--attention-backend", default="flashinfer", help="sglang engine (on the CPU: torch_native)")
    p.add_argument("--sglang-device", default="cuda", choices=["cuda", "cpu"], help="sglang engine: GPUs, or SGLang's CPU engine (tests; needs a CPU sgl_kernel)")
    p.add_argument("--mem-fraction-static", type=float, default=0.85, help="sglang engine")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vllm engine: the share of the device vLLM may use for weights and activations (leave room on the device of --device for the teacher's head); the KV cache is --kv-cache-gb")
    p.add_argument("--kv-cache-gb", type=float, help="vllm engine: KV cache size in GiB (default: sized for capture, one batch and one longest prompt; engines.vllm.capture_kv_cache_bytes)")
    p.add_argument("--max-model-len", type=int, help="vllm engine: longest prompt + 1 (default: the prepared data's max_length + 1, else the target's max_position_embeddings)")
    p.add_argument("--vllm-tmp", help="vllm engine: directory for vLLM's per-request hidden-state files, each deleted once read (default: the system temp dir)")
    p.add_argument("--vllm-compile", action="store_true", help="vllm engine: let vLLM compile the model (default eager: capture is prefill only)")
    p.add_argument("--no-checksums", action="store_true", help="skip the sha256 of each shard in the manifest")
    p.add_argument("--self-test", nargs="?", const="all", choices=["all", "tiny", "real"], help="run the pre-flight self-test (aerie_capture.selftest) instead of a capture: both phases, or one")
    p.add_argument("--json", action="store_true", help="(accepted for symmetry with aerie; the report is always JSON)")
    a = p.parse_args(argv)
    if a.self_test is None and (a.data is None or a.out is None or a.metadata is None):
        p.error("--data, --out and --metadata are required")
    return a


class BackgroundWriter:
    """Rank 0's writer thread: host copies and `ShardWriter.push` behind a bounded queue, so a
    slow disk stalls the engine only after two batches are waiting. An error on the thread is
    raised at the next `put` or at `close`."""

    def __init__(self, writer: ShardWriter, depth: int = 2):
        self.writer = writer
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="aerie-shard-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is not None:
                continue
            try:
                samples, outs = item
                for s, o in zip(samples, outs):
                    self.writer.push(
                        s.input_ids,
                        s.loss_mask,
                        o.aux.cpu(),
                        None if o.final is None else o.final.cpu(),
                        None if o.topk_ids is None else o.topk_ids.cpu(),
                        None if o.topk_logprobs is None else o.topk_logprobs.cpu(),
                        s.sample_id,
                    )
            except BaseException as e:  # noqa: BLE001 - re-raised on the main thread
                self.error = e

    def put(self, samples, outs) -> None:
        if self.error is not None:
            raise self.error
        self.q.put((samples, outs))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def run(a: argparse.Namespace) -> dict:
    md = metadata_arg(a)
    data = PreparedDataset(a.data)
    max_model_len(a, data)
    if Path(a.out).is_dir() and int(os.environ.get("RANK", "0")) == 0:
        # Refuse a dataset another writer holds before loading the target (minutes for a large
        # one, vLLM's start included); the writer takes the lock for good below.
        DirLock(Path(a.out)).release()
    engine = build_engine(a, md.aux_layer_ids, md.teacher)
    engine.check_metadata(md)
    md.created_by = f"{md.created_by} ({engine.description})"
    rank0 = engine.is_writer
    resumed = 0
    writer = None
    if rank0:
        writer, info_r = ShardWriter.open_or_create(a.out, md, a.shard_tokens, not a.no_checksums)
        resumed = info_r.samples if info_r else 0
        done_ids = info_r.sample_ids if info_r else set()
    resumed = engine.broadcast(resumed)
    available = data.len(a.split)
    total = min(available, a.max_samples) if a.max_samples is not None else available

    def todo():
        for i, s in enumerate(data.samples(a.split, limit=total)):
            if i < resumed:
                # The deterministic order is what makes resume by count correct; the ids say so.
                if rank0 and done_ids and s.sample_id not in done_ids:
                    raise SystemExit(f"{a.out}: resume: input #{i} (id {s.sample_id}) is not in the dataset; was it captured from other data?")
                continue
            yield s

    bg = BackgroundWriter(writer) if rank0 else None
    start = time.monotonic()
    samples = tokens = 0
    last = start
    try:
        for batch in token_budget_batches(todo(), a.max_batch_tokens, a.max_batch_samples):
            outs = engine.capture([s.input_ids for s in batch])
            if bg is not None:
                bg.put(batch, outs)
            samples += len(batch)
            tokens += sum(len(s.input_ids) for s in batch)
            now = time.monotonic()
            if rank0 and now - last > 10:
                last = now
                print(f"aerie_capture: {resumed + samples}/{total} samples, {tokens / (now - start):.0f} tokens/s", file=sys.stderr, flush=True)
        if bg is not None:
            bg.close()
            bg = None
            manifest = writer.finish()
    finally:
        if bg is not None:
            bg.close()
        if writer is not None:
            writer.close()
    seconds = time.monotonic() - start
    report = {
        "engine": a.engine,
        "created_by": md.created_by,
        "out": str(a.out),
        "resumed_samples": resumed,
        "captured_samples": samples,
        "captured_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / max(seconds, 1e-9),
    }
    if rank0:
        report["dataset_samples"] = manifest.samples
        report["dataset_tokens"] = manifest.tokens
    engine.shutdown()
    return report if rank0 else {}


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    missing = missing_worker_modules()
    if missing:
        # Before any engine starts (vLLM's start alone takes a minute).
        raise SystemExit(f"aerie_capture: {sys.executable} lacks what the capture worker needs:\n  " + "\n  ".join(missing))
    if a.self_test is not None:
        from .selftest import self_test

        return self_test(a)
    report = run(a)
    if report:
        print(json.dumps(report), flush=True)
    return 0
