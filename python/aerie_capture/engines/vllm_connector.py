"""vLLM's `ExampleHiddenStatesConnector` for the CPU: the same extraction, files and locks, with
the copy done synchronously.

vLLM 0.32's connector copies each finished request's hidden states out of the cache-only layer
through a CUDA stream into pinned host memory; on vLLM's CPU build the first finished request
kills the engine with "Found no NVIDIA driver" (shared/reference/vllm.md). On the CPU the cache
already is host memory, so the copy is a `clone` (the blocks are freed and reused once the
request is reported finished). Everything else is the parent's: the per-request file
`{shared_storage_path}/{request_id}.safetensors` with `hidden_states` and `token_ids`, written
on TP rank 0's writer threads, and its `.lock` file held until the write is complete, so
`load_hidden_states` blocks until the file is whole.

vLLM imports this module in its engine processes (`kv_connector_module_path`); the vLLM engine
(`engines/vllm.py`) picks it when vLLM runs on the CPU and vLLM's own class on GPUs.
`check_api()` in `engines/vllm.py` asserts the parent's members used here.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Copied:
    """Stands in for the CUDA event the parent waits on: the copy is already done."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class AerieCpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + blocks[:, None] * self._block_size).flatten()
        n = pending.token_ids.shape[0]
        hidden = extract_from_kv_cache(self._kv_cache, slots, n).clone()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}
        if self._req_futures.get(pending.req_id) is not None:
            raise RuntimeError(f"two hidden-state writes for request {pending.req_id}")
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Copied()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
