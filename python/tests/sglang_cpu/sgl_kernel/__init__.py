"""A TEST-ONLY stand-in for the `sgl_kernel` CPU operators SGLang 0.5.23 calls on `--device cpu`.

FOR TESTS ONLY. PyPI's `sglang-kernel` wheel holds CUDA kernels only, and SGLang's real CPU kernels
are C++ in SGLang's repository (`sgl-kernel/csrc/cpu`, built from source). This package lets aerie's
tests run SGLang's own scheduler, EAGLE-3 worker, model classes, loader and acceptance accounting on
a CPU without them: it supplies, in plain torch, the few operators SGLang's CPU path cannot do
without (the `intel_amx` attention backend, which EAGLE needs on the CPU, and the KV-cache and
speculative-decoding helpers imported at module level). It is slow Python: real CPU speed needs
SGLang's compiled CPU kernels, and nothing measured through it says anything about speed.

Written for aerie from the operators' semantics in SGLang 0.5.23 (their Triton versions beside the
call sites, `sglang/kernels/ops/speculative/*.py`, `sglang/srt/mem_cache/allocation.py`, and the
call sites in `sglang/srt/layers/attention/intel_amx_backend.py`). `python/tests/test_sgl_kernel_standin.py`
checks every operator against a straightforward reference.

It is found only when a test puts this directory first on the path (`AERIE_SGLANG_TEST_KERNELS`,
read by `python -m aerie_serve sglang`); production never imports it. It deliberately does NOT
define `convert_weight_packed`: SGLang gates its AMX-packed layers on that operator, so without it
every layer takes its `forward_native` torch code.
"""

from __future__ import annotations

import torch

from . import ops

__version__ = "0.0.0+aerie-test-standin"

# Registered once per process under the `sgl_kernel` namespace, as the C++ extension does.
ops.register()

# Not a kernel, but the same kind of gap: SGLang 0.5.23's MLA EAGLE-3 drafter
# (`sglang/srt/models/kimi_k25_eagle3.py`, `set_embed` and `set_embed_and_head`, which take the
# target's embedding when the draft and target hidden sizes are equal) calls
# `torch.cuda.synchronize()` unconditionally, which raises "Found no NVIDIA driver" on a machine
# without CUDA. There is no device to wait for there, so in a process without CUDA the call does
# nothing. (SGLang's own CPU build would hit the same call: docs/kimi-k25.md.)
if not torch.cuda.is_available():
    torch.cuda.synchronize = lambda device=None: None

# The module-level names SGLang 0.5.23 imports on the CPU.
copy_all_layer_kv_cache_cpu = ops.copy_all_layer_kv_cache_cpu
assign_req_to_token_pool_cpu = ops.assign_req_to_token_pool_cpu
fill_bonus_tokens_cpu = ops.fill_bonus_tokens_cpu
fill_accept_out_cache_loc_cpu = ops.fill_accept_out_cache_loc_cpu
assign_draft_cache_locs_contiguous_cpu = ops.assign_draft_cache_locs_contiguous_cpu
assign_extend_cache_locs_cpu = ops.assign_extend_cache_locs_cpu
build_tree_kernel_efficient_cpu = ops.build_tree_kernel_efficient_cpu
verify_tree_greedy_cpu = ops.verify_tree_greedy_cpu


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    return torch.ops.sgl_kernel.build_draft_decode_metadata_cpu(
        req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len
    )
