"""The operators of the test-only `sgl_kernel` stand-in (see the package docstring), in plain torch.

Each function states the semantics it implements and where SGLang 0.5.23 shows them. Index tensors
may be int32 or int64, as SGLang passes either; everything is computed per request in Python loops,
which is slow and deliberately simple.
"""

from __future__ import annotations

import ctypes

import torch

_LIBRARY = None  # the torch.library handle; kept alive for the process's lifetime


def register() -> None:
    """Define the operators SGLang calls as `torch.ops.sgl_kernel.*` (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    lib = torch.library.Library("sgl_kernel", "DEF")
    lib.define(
        "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, "
        "float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
        "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
    )
    lib.define(
        "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
        "Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
        "int max_len_extend, float sm_scale, float logit_cap, bool is_cross_attention, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
    )
    lib.define(
        "build_draft_decode_metadata_cpu(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
        "int topk, int num_steps, int pool_len) -> Tensor"
    )
    lib.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
    lib.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
    lib.impl("build_draft_decode_metadata_cpu", build_draft_decode_metadata_cpu, "CPU")
    _LIBRARY = lib


def _ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale [capped, masked]) · v in float32.

    q [Q, H, D], k [L, Hkv, D], v [L, Hkv, Dv] (H a multiple of Hkv: grouped-query heads share a
    KV head, query head h reads KV head h // (H / Hkv)); allowed [Q, L] bool or None (all).
    `logit_cap` > 0 soft-caps the scores as cap·tanh(s / cap). `sinks` [H] adds one extra logit
    per head to the softmax's denominator (attention sinks), which attends to nothing.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)  # [L, H, D]
    vf = v.float().repeat_interleave(group, dim=1)  # [L, H, Dv]
    scores = torch.einsum("qhd,lhd->hql", qf, kf) * sm_scale  # [H, Q, L]
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(heads, 1, 1).expand(heads, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hql,lhd->qhd", probs, vf)  # [Q, H, Dv]


def decode_attention_cpu(
    query, k_cache, v_cache, k_scale, v_scale, output, key, value, loc, attn_logits,
    req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap, is_cross_attention,
    sliding_window_size, encoder_lens, sinks,
):
    """One new token per sequence (`intel_amx_backend.forward_decode`).

    When `key`/`value` are given, they are first written into the caches at `loc` (the kernel
    writes the new token's KV itself). Sequence i's query [H, D] then attends to the cache rows
    `req_to_token[req_pool_indices[i], :seq_lens[i]]` (seq_lens counts the new token), the last
    `sliding_window_size` of them when that is > 0 (SGLang passes the layer's window + 1: keys
    with q_pos − k_pos < it). Cached values are multiplied by `k_scale`/`v_scale` (fp8 caches).
    `attn_logits` is the C++ kernel's split-K scratch; this version needs none.
    """
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel test stand-in: decode cross-attention is not implemented")
    if key is not None and value is not None:
        rows = loc.long()
        k_cache[rows] = key.to(k_cache.dtype)
        v_cache[rows] = value.to(v_cache.dtype)
    reqs, lens = _ints(req_pool_indices), _ints(seq_lens)
    for i, (req, n) in enumerate(zip(reqs, lens)):
        start = max(0, n - sliding_window_size) if sliding_window_size > 0 else 0
        slots = req_to_token[req, start:n].long()
        k = k_cache[slots].float() * k_scale
        v = v_cache[slots].float() * v_scale
        out = _attend(query[i : i + 1], k, v, None, sm_scale, logit_cap, sinks)
        output[i] = out[0].to(output.dtype)


def extend_attention_cpu(
    q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale, req_to_token,
    req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend, sm_scale,
    logit_cap, is_cross_attention, sliding_window_size, encoder_lens, sinks, tree_mask, is_causal,
):
    """Prefill, chunked prefill and speculative verify (`intel_amx_backend.forward_extend`).

    Sequence i has `seq_lens[i]` tokens, of which the last `extend_seq_lens[i]` are new; its new
    queries are rows `extend_start_loc[i]`… of `q_extend`. The prefix keys come from the caches
    (`req_to_token` rows, already written), the new ones from `k_extend`/`v_extend` (or from the
    caches when those are None: layers sharing another layer's KV). New query j sits at absolute
    position prefix + j and sees, by default, keys 0..prefix + j (causal); with `is_causal` False
    every key; with `tree_mask` (speculative trees; SGLang passes none for a top-k 1 chain) the
    whole prefix and, among the new tokens, those its row allows: on the CPU SGLang builds the
    QLEN_ONLY mask (`eagle_utils.default_tree_mask_mode`), the requests' [extend_len, extend_len]
    boolean blocks flattened one after another. A sliding window
    (`sliding_window_size` > 0, the layer's window + 1) also hides keys with q_pos − k_pos ≥ it.
    """
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel test stand-in: extend cross-attention is not implemented")
    reqs, lens = _ints(req_pool_indices), _ints(seq_lens)
    ext_lens, starts = _ints(extend_seq_lens), _ints(extend_start_loc)
    mask_offset = 0
    for i, (req, n, e, s) in enumerate(zip(reqs, lens, ext_lens, starts)):
        prefix = n - e
        slots = req_to_token[req, :n].long()
        if k_extend is not None and v_extend is not None and prefix == 0:
            # No prefix: the caches are not read (MLA's MHA prefill caches the latent, whose
            # shape is not the new keys').
            k, v = k_extend[s : s + e].float(), v_extend[s : s + e].float()
        elif k_extend is not None and v_extend is not None:
            k = torch.cat([k_buffer[slots[:prefix]].float() * k_scale, k_extend[s : s + e].float()])
            v = torch.cat([v_buffer[slots[:prefix]].float() * v_scale, v_extend[s : s + e].float()])
        else:
            k = k_buffer[slots].float() * k_scale
            v = v_buffer[slots].float() * v_scale
        q_pos = torch.arange(prefix, n).unsqueeze(1)  # [e, 1]
        k_pos = torch.arange(n).unsqueeze(0)  # [1, n]
        if tree_mask is not None:
            block = tree_mask[mask_offset : mask_offset + e * e].view(e, e).bool()
            mask_offset += e * e
            allowed = torch.cat([torch.ones(e, prefix, dtype=torch.bool), block], dim=1)
        elif is_causal:
            allowed = k_pos <= q_pos
        else:
            allowed = torch.ones(e, n, dtype=torch.bool)
        if sliding_window_size > 0:
            allowed = allowed & (q_pos - k_pos < sliding_window_size)
        out = _attend(q_extend[s : s + e], k, v, allowed, sm_scale, logit_cap, sinks)
        o_extend[s : s + e] = out.to(o_extend.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    """The multi-step draft's KV table (`IntelAMXMultiStepDraftBackend.init_forward_metadata`).

    Row b·topk + t: request b's committed prefix `req_to_token[r, :seq_lens[b]]`, then candidate
    t's `num_steps` draft slots, which `assign_draft_cache_locs_contiguous` laid out at
    `seq_lens[b] + t·num_steps`. Entries past `seq_lens[b] + num_steps` are left zero (undefined in
    the C++ kernel: nothing reads them).
    """
    reqs, lens = _ints(req_pool_indices), _ints(seq_lens)
    out = torch.zeros((len(reqs) * topk, pool_len), dtype=req_to_token.dtype)
    for b, (req, n) in enumerate(zip(reqs, lens)):
        for t in range(topk):
            row = out[b * topk + t]
            row[:n] = req_to_token[req, :n]
            first = n + t * num_steps
            row[n : n + num_steps] = req_to_token[req, first : first + num_steps]
    return out


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """`req_to_token[req_pool_indices[i], start[i]:end[i]]` = the next end[i] − start[i] entries of
    `out_cache_loc`, requests packed one after another (Triton `assign_req_to_token_pool`)."""
    offset = 0
    for req, a, b in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        req_to_token[req, a:b] = out_cache_loc[offset : offset + b - a].to(req_to_token.dtype)
        offset += b - a


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """The reverse gather: `out_cache_loc`, packed, = `req_to_token[req_pool_indices[i],
    start[i]:end[i]]` for each i (Triton `assign_extend_cache_locs`)."""
    offset = 0
    for req, a, b in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        out_cache_loc[offset : offset + b - a] = req_to_token[req, a:b].to(out_cache_loc.dtype)
        offset += b - a


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps):
    """Request i's `topk·num_steps` draft slots `req_to_token[r, seq_lens[i]:…]` into
    `out_cache_loc[i·topk·num_steps:…]` (Triton `assign_draft_cache_locs_contiguous`)."""
    width = topk * num_steps
    for i, (req, n) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens))):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[req, n : n + width].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """`bonus_tokens[i]` = request i's last accepted token, `accept_tokens` flat at
    `accept_stride·i + accept_lens[i] − 1` (accept_lens counts the bonus; Triton `fill_bonus_tokens`)."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(_ints(accept_lens)):
        bonus_tokens[i] = flat[accept_stride * i + n - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Compact the cache slots of accepted tokens: for each entry of `accept_index` (flat) that is
    not −1, in order, the next entry of `accept_out_cache_loc` = `out_cache_loc[entry]` (Triton
    `fill_accept_out_cache_loc`)."""
    idx = accept_index.reshape(-1).long()
    kept = idx[idx != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer b (`data_ptrs[b]`, rows of `strides[b]` bytes), row `tgt_loc[j]` = row
    `src_loc[j]`, all rows read before any is written (the Triton `copy_all_layer_kv_cache_tiled`
    is safe in place)."""
    src, tgt = _ints(src_loc), _ints(tgt_loc)
    for base, stride in zip(_ints(data_ptrs), _ints(strides)):
        rows = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * stride, row, stride)


def build_tree_kernel_efficient_cpu(
    parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
    retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
):
    """The EAGLE draft tree's verify layout (Triton `sgl_build_tree_kernel_efficient_triton`):
    positions, the retrieve index and next-token / next-sibling links, and the tree mask (mode 0:
    FULL_MASK, per request [draft, seq_len + draft] blocks after the earlier requests' blocks;
    mode 1: QLEN_ONLY, [draft, draft] blocks). Mode 2 (bit-packed) is not implemented."""
    if int(tree_mask_mode) == 2:
        raise NotImplementedError("sgl_kernel test stand-in: QLEN_ONLY_BITPACKING tree masks are not implemented")
    n = draft_token_num
    lens = _ints(verified_seq_len)
    flat_mask = tree_mask.view(-1)
    prefix_sum = 0
    for b, seq_len in enumerate(lens):
        sel = _ints(selected_index[b])
        parents = _ints(parent_list[b]) if parent_list.dim() > 1 else _ints(parent_list)
        seq_tree_idx = n * n * b + prefix_sum * n
        prefix_sum += seq_len
        positions[b * n] = seq_len

        def position_of(token_idx: int) -> int | None:
            for p in range(n - 1):
                if sel[p] == token_idx:
                    return p
            return None

        for i in range(n - 1, 0, -1):
            retrive_index[b, i] = b * n + i
            parent_tb = sel[i - 1] // topk
            if parent_tb == 0:
                parent_position = 0
            else:
                p = position_of(parents[parent_tb])
                if p is None:
                    continue
                parent_position = p + 1
            nxt = int(retrive_next_token[b, parent_position])
            retrive_next_token[b, parent_position] = i
            if nxt != -1:
                retrive_next_sibling[b, i] = nxt
        retrive_index[b, 0] = b * n

        for x in range(n):
            if int(tree_mask_mode) == 0:
                row = seq_tree_idx + (seq_len + n) * x + seq_len + 1
            else:
                row = n * n * b + n * x + 1
            flat_mask[row - 1] = True
            flat_mask[row : row + n - 1] = False
            if x == 0:
                continue
            cur, position = x - 1, 0
            for _ in range(depth):
                position += 1
                flat_mask[row + cur] = True
                parent_tb = sel[cur] // topk
                if parent_tb == 0:
                    break
                p = position_of(parents[parent_tb])
                if p is None:
                    break
                cur = p
            positions[b * n + x] = position + seq_len


def verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
):
    """Greedy verification of each request's draft tree (Triton `verify_tree_greedy_kernel_triton`):
    walk from the root, at each level accept the first child (following sibling links) whose draft
    token equals the target's greedy token at the last accepted node, until none does or
    `accept_index.shape[1] − 1` drafts are accepted. Writes the accepted nodes' retrieve indices to
    `accept_index` (root first), their count (drafts only) to `accept_token_num`, and the target's
    token at every accepted node, the bonus included, to `predicts`."""
    batch, n = candidates.shape
    steps = accept_index.shape[1]
    target = target_predict.reshape(-1)
    for b in range(batch):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for j in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            token = int(target[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == token:
                    draft_index = int(retrive_index[b, cur])
                    predicts[last] = token
                    accepted += 1
                    accept_index[b, accepted] = draft_index
                    last = draft_index
                    matched = True
                    break
                cur = int(retrive_next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = accepted
        predicts[last] = target[last]
