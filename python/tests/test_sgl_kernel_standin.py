"""The test-only `sgl_kernel` stand-in (python/tests/sglang_cpu) against straightforward references:
attention as an explicit per-head softmax(q·kᵀ·scale)·v over the keys each query may see (listed
by position, not masked), and the KV-cache / speculative helpers against their one-line meanings
and hand-worked chains. Only torch is needed (no SGLang).

Tolerance: 1e-5 absolute in float32 (the stand-in and the reference sum in different orders over
at most 40 keys of unit-scale values); bit equality for every integer operator.
"""

import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "sglang_cpu"))
import sgl_kernel  # noqa: E402  (the stand-in, found only through the line above)

ops = torch.ops.sgl_kernel
TOL = 1e-5


def reference_attention(q, keys, values, scale, cap=0.0, sink=None):
    """One query vector q [D] over keys [L, D], values [L, Dv]: the textbook formula, one head."""
    logits = [float(q @ k) * scale for k in keys]
    if cap > 0:
        logits = [cap * torch.tanh(torch.tensor(x / cap)).item() for x in logits]
    m = max(logits + ([float(sink)] if sink is not None else []))
    w = [torch.exp(torch.tensor(x - m)).item() for x in logits]
    total = sum(w) + (torch.exp(torch.tensor(float(sink) - m)).item() if sink is not None else 0.0)
    return sum(wi / total * v for wi, v in zip(w, values))


class Pool:
    """A KV pool of `slots` rows and a req_to_token table whose requests own scattered slots."""

    def __init__(self, seed, slots=128, kv_heads=2, dim=8, dv=8, reqs=4, pool_len=24):
        g = torch.Generator().manual_seed(seed)
        self.k = torch.randn(slots, kv_heads, dim, generator=g)
        self.v = torch.randn(slots, kv_heads, dv, generator=g)
        perm = torch.randperm(slots, generator=g)[: reqs * pool_len]
        self.req_to_token = perm.view(reqs, pool_len).to(torch.int32)
        self.g = g


class DecodeAttention(unittest.TestCase):
    def run_case(self, heads, kv_heads, cap=0.0, window=0, with_sinks=False, write_new=True):
        pool = Pool(1, kv_heads=kv_heads)
        g = pool.g
        reqs = torch.tensor([2, 0, 3], dtype=torch.int64)
        seq_lens = torch.tensor([5, 17, 1], dtype=torch.int64)
        q = torch.randn(3, heads, 8, generator=g)
        key = torch.randn(3, kv_heads, 8, generator=g)
        value = torch.randn(3, kv_heads, 8, generator=g)
        loc = torch.stack([pool.req_to_token[r, n - 1] for r, n in zip(reqs, seq_lens)]).long()
        sinks = torch.randn(heads, generator=g) if with_sinks else None
        out = torch.zeros(3, heads, 8)
        k_cache, v_cache = pool.k.clone(), pool.v.clone()
        scale = 0.3
        ops.decode_attention_cpu(
            q, k_cache, v_cache, 1.0, 1.0, out, key if write_new else None, value if write_new else None,
            loc, torch.zeros(3, heads, 8, 9), pool.req_to_token, reqs, seq_lens, scale, cap, False,
            window, None, sinks,
        )
        if write_new:
            torch.testing.assert_close(k_cache[loc], key, rtol=0, atol=0)
            torch.testing.assert_close(v_cache[loc], value, rtol=0, atol=0)
        group = heads // kv_heads
        for i, (r, n) in enumerate(zip(reqs.tolist(), seq_lens.tolist())):
            first = max(0, n - window) if window > 0 else 0
            slots = pool.req_to_token[r, first:n].long().tolist()
            for h in range(heads):
                ks = [k_cache[s, h // group] for s in slots]
                vs = [v_cache[s, h // group] for s in slots]
                want = reference_attention(q[i, h], ks, vs, scale, cap, None if sinks is None else sinks[h])
                self.assertLess((out[i, h] - want).abs().max().item(), TOL, (i, h))

    def test_multi_head(self):
        self.run_case(heads=2, kv_heads=2)

    def test_grouped_query_heads_share_their_kv_head(self):
        self.run_case(heads=6, kv_heads=2)

    def test_soft_cap_window_and_sinks(self):
        self.run_case(heads=4, kv_heads=2, cap=2.0, window=4, with_sinks=True)

    def test_cache_already_holding_the_new_token(self):
        self.run_case(heads=2, kv_heads=1, write_new=False)


class ExtendAttention(unittest.TestCase):
    def setup(self, heads=4, kv_heads=2):
        pool = Pool(2, kv_heads=kv_heads)
        g = pool.g
        reqs = torch.tensor([1, 3], dtype=torch.int64)
        ext = torch.tensor([4, 3], dtype=torch.int32)
        seq = torch.tensor([9, 3], dtype=torch.int64)  # a prefix of 5 cached tokens, then none
        starts = torch.tensor([0, 4], dtype=torch.int32)
        q = torch.randn(7, heads, 8, generator=g)
        k_ext = torch.randn(7, kv_heads, 8, generator=g)
        v_ext = torch.randn(7, kv_heads, 8, generator=g)
        # The backend writes the new KV into the pool before it calls the kernel.
        for i, (r, n, e, s) in enumerate(zip(reqs.tolist(), seq.tolist(), ext.tolist(), starts.tolist())):
            slots = pool.req_to_token[r, n - e : n].long()
            pool.k[slots] = k_ext[s : s + e]
            pool.v[slots] = v_ext[s : s + e]
        return pool, reqs, ext, seq, starts, q, k_ext, v_ext

    def run_kernel(self, pool, reqs, ext, seq, starts, q, k_ext, v_ext, window=0, mask=None, causal=True, cap=0.0):
        out = torch.zeros_like(q)
        ops.extend_attention_cpu(
            q, k_ext, v_ext, out, pool.k, pool.v, 1.0, 1.0, pool.req_to_token, reqs, seq, ext, starts,
            int(ext.max()), 0.25, cap, False, window, None, None, mask, causal,
        )
        return out

    def reference(self, pool, reqs, ext, seq, starts, q, visible, cap=0.0):
        """visible(i, j, n, prefix) -> the key positions new query j of request i may see."""
        heads, kv_heads = q.shape[1], pool.k.shape[1]
        out = torch.zeros_like(q)
        for i, (r, n, e, s) in enumerate(zip(reqs.tolist(), seq.tolist(), ext.tolist(), starts.tolist())):
            prefix = n - e
            for j in range(e):
                pos = visible(i, j, n, prefix)
                slots = [int(pool.req_to_token[r, p]) for p in pos]
                for h in range(heads):
                    kh = h // (heads // kv_heads)
                    out[s + j, h] = reference_attention(
                        q[s + j, h], [pool.k[x, kh] for x in slots], [pool.v[x, kh] for x in slots], 0.25, cap
                    )
        return out

    def test_causal_over_prefix_and_new_tokens(self):
        case = self.setup()
        got = self.run_kernel(*case, cap=1.5)
        want = self.reference(*case[:6], lambda i, j, n, p: range(p + j + 1), cap=1.5)
        self.assertLess((got - want).abs().max().item(), TOL)

    def test_keys_from_the_cache_when_no_new_kv_is_passed(self):
        case = self.setup()
        got = self.run_kernel(*case[:6], None, None)
        self.assertLess((got - self.run_kernel(*case)).abs().max().item(), TOL)

    def test_sliding_window(self):
        case = self.setup()
        got = self.run_kernel(*case, window=3)
        want = self.reference(*case[:6], lambda i, j, n, p: range(max(0, p + j - 2), p + j + 1))
        self.assertLess((got - want).abs().max().item(), TOL)

    def test_not_causal_sees_every_key(self):
        case = self.setup()
        got = self.run_kernel(*case, causal=False)
        want = self.reference(*case[:6], lambda i, j, n, p: range(n))
        self.assertLess((got - want).abs().max().item(), TOL)

    def test_tree_mask_rows_choose_the_keys(self):
        case = self.setup()
        pool, reqs, ext, seq = case[:4]
        g = torch.Generator().manual_seed(5)
        blocks, allowed = [], {}
        for i, e in enumerate(ext.tolist()):
            m = torch.rand(e, e, generator=g) < 0.5
            blocks.append(m.reshape(-1))
            allowed[i] = m
        got = self.run_kernel(*case, mask=torch.cat(blocks))
        # The committed prefix stays visible; among the new tokens, what the row allows.
        want = self.reference(
            *case[:6], lambda i, j, n, p: list(range(p)) + [p + x for x in range(n - p) if allowed[i][j, x]]
        )
        self.assertLess((got - want).abs().max().item(), TOL)


class Helpers(unittest.TestCase):
    def test_build_draft_decode_metadata(self):
        pool = Pool(3)
        reqs = torch.tensor([3, 1], dtype=torch.int64)
        seq = torch.tensor([4, 7], dtype=torch.int64)
        topk, steps = 2, 3
        got = ops.build_draft_decode_metadata_cpu(pool.req_to_token, reqs, seq, topk, steps, 24)
        self.assertEqual(got.shape, (4, 24))
        self.assertEqual(got.dtype, torch.int32)
        for b, (r, n) in enumerate(zip(reqs.tolist(), seq.tolist())):
            row = pool.req_to_token[r]
            for t in range(topk):
                want = torch.cat([row[:n], row[n + t * steps : n + (t + 1) * steps]])
                self.assertTrue(torch.equal(got[b * topk + t, : n + steps], want))

    def test_req_to_token_assign_and_gather_are_inverse(self):
        table = torch.zeros(3, 10, dtype=torch.int32)
        reqs = torch.tensor([2, 0], dtype=torch.int64)
        start, end = torch.tensor([1, 4]), torch.tensor([4, 6])
        locs = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)
        sgl_kernel.assign_req_to_token_pool_cpu(reqs, table, start, end, locs, 10)
        self.assertEqual(table[2, 1:4].tolist(), [11, 12, 13])
        self.assertEqual(table[0, 4:6].tolist(), [21, 22])
        self.assertEqual(int(table.count_nonzero()), 5)
        back = torch.zeros(5, dtype=torch.int64)
        sgl_kernel.assign_extend_cache_locs_cpu(reqs, table, start, end, back, 10)
        self.assertEqual(back.tolist(), locs.tolist())

    def test_draft_cache_locs(self):
        table = torch.arange(40, dtype=torch.int32).view(2, 20)
        out = torch.zeros(2 * 2 * 3, dtype=torch.int64)
        sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
            torch.tensor([1, 0]), table, torch.tensor([5, 2]), out, 20, 2, 3
        )
        self.assertEqual(out.tolist(), list(range(25, 31)) + list(range(2, 8)))

    def test_bonus_tokens_and_accepted_cache_slots(self):
        accept_tokens = torch.tensor([[7, 8, 9, 0], [5, 0, 0, 0]])
        bonus = torch.zeros(2, dtype=torch.int64)
        sgl_kernel.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([3, 1]), bonus, 4)
        self.assertEqual(bonus.tolist(), [9, 5])
        accept_index = torch.tensor([[0, 1, -1], [4, -1, -1]])
        out_cache_loc = torch.tensor([100, 101, 102, 103, 104, 105])
        got = torch.full((6,), -7, dtype=torch.int64)
        sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
        self.assertEqual(got.tolist(), [100, 101, 104, -7, -7, -7])

    def test_copy_all_layer_kv_cache_reads_before_it_writes(self):
        layers = [torch.arange(24, dtype=torch.float32).view(6, 4).clone() for _ in range(2)]
        layers[1] *= -1
        ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)
        strides = torch.tensor([4 * 4, 4 * 4], dtype=torch.int64)
        before = [t.clone() for t in layers]
        # Swap rows 1 and 2 and copy row 0 to row 5 in one call.
        sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 2, 5]), torch.tensor([2, 1, 0]))
        for t, b in zip(layers, before):
            self.assertTrue(torch.equal(t[1], b[2]) and torch.equal(t[2], b[1]) and torch.equal(t[5], b[0]))
            self.assertTrue(torch.equal(t[[0, 3, 4]], b[[0, 3, 4]]))


class ChainTree(unittest.TestCase):
    """top-k 1, the chain aerie runs: draft tokens d1..dk after the verified token; the tree is a
    line, positions count on from the sequence length, each token sees its ancestors."""

    def build(self, seq_lens, steps, mode=0):
        n = steps + 1
        bs = len(seq_lens)
        # What SGLang's `organize_draft_results` hands over for top-k 1 (`select_top_k_tokens`):
        # parents [-1, 0, 1, ..., steps-2] and the selected candidates [0, 1, ..., steps-1].
        parent_list = torch.arange(-1, steps - 1, dtype=torch.int64).repeat(bs, 1)
        selected = torch.arange(n - 1, dtype=torch.int64).repeat(bs, 1)
        seq = torch.tensor(seq_lens, dtype=torch.int64)
        size = sum(n * (s + n) for s in seq_lens) if mode == 0 else bs * n * n
        # SGLang allocates the FULL_MASK buffer as True (the prefix columns stay so), QLEN_ONLY as zeros.
        mask = torch.ones(size, dtype=torch.bool) if mode == 0 else torch.zeros(size, dtype=torch.bool)
        positions = torch.zeros(bs * n, dtype=torch.int64)
        index = torch.full((bs, n), -1, dtype=torch.int64)
        nxt = torch.full((bs, n), -1, dtype=torch.int64)
        sib = torch.full((bs, n), -1, dtype=torch.int64)
        sgl_kernel.build_tree_kernel_efficient_cpu(
            parent_list, selected, seq, mask, positions, index, nxt, sib, 1, steps, n, mode
        )
        return mask, positions, index, nxt, sib

    def test_build_a_chain(self):
        seq_lens, steps = [5, 2], 3
        n = steps + 1
        mask, positions, index, nxt, sib = self.build(seq_lens, steps)
        offset = 0
        for b, s in enumerate(seq_lens):
            self.assertEqual(positions[b * n : (b + 1) * n].tolist(), [s + i for i in range(n)])
            self.assertEqual(index[b].tolist(), [b * n + i for i in range(n)])
            self.assertEqual(nxt[b].tolist(), [1, 2, 3, -1])
            self.assertEqual(sib[b].tolist(), [-1] * n)
            block = mask[offset : offset + n * (s + n)].view(n, s + n)
            offset += n * (s + n)
            want = torch.ones(n, s + n, dtype=torch.bool)
            want[:, s:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            self.assertTrue(torch.equal(block, want), (b, block))

    def test_build_a_chain_qlen_only_mask(self):
        # The mode SGLang uses on the CPU (`default_tree_mask_mode`): [draft, draft] blocks.
        mask, positions, *_ = self.build([5, 2], 3, mode=1)
        tril = torch.tril(torch.ones(4, 4, dtype=torch.bool))
        self.assertTrue(torch.equal(mask.view(2, 4, 4), torch.stack([tril, tril])))
        self.assertEqual(positions.tolist(), [5, 6, 7, 8, 2, 3, 4, 5])

    def test_greedy_verify_accepts_the_longest_matching_prefix(self):
        seq_lens, steps = [5, 2, 3], 3
        n = steps + 1
        _, _, index, nxt, sib = self.build(seq_lens, steps)
        # candidates[b] = [verified token, d1, d2, d3]; target[b][i] = the target's greedy token
        # after candidate i. Request 0 accepts 2 drafts, request 1 all 3, request 2 none.
        candidates = torch.tensor([[9, 4, 5, 6], [9, 1, 2, 3], [9, 7, 7, 7]])
        target = torch.tensor([[4, 5, 8, 0], [1, 2, 3, 42], [6, 0, 0, 0]])
        predicts = torch.full((3 * n,), -1, dtype=torch.int64)
        accept_index = torch.full((3, n), -1, dtype=torch.int64)
        accept_num = torch.zeros(3, dtype=torch.int64)
        sgl_kernel.verify_tree_greedy_cpu(
            predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
            retrive_index=index, retrive_next_token=nxt, retrive_next_sibling=sib, target_predict=target,
        )
        self.assertEqual(accept_num.tolist(), [2, 3, 0])
        self.assertEqual(accept_index.tolist(), [[0, 1, 2, -1], [4, 5, 6, 7], [8, -1, -1, -1]])
        # The emitted tokens: the accepted drafts and the bonus (the target's token after the last).
        self.assertEqual(predicts[0:3].tolist(), [4, 5, 8])
        self.assertEqual(predicts[4:8].tolist(), [1, 2, 3, 42])
        self.assertEqual(predicts[8:9].tolist(), [6])


class Registration(unittest.TestCase):
    def test_the_amx_weight_packing_op_is_absent(self):
        # SGLang's AMX-packed layers are gated on this op: its absence keeps them on forward_native.
        self.assertFalse(hasattr(torch.ops.sgl_kernel, "convert_weight_packed"))
        for name in ("decode_attention_cpu", "extend_attention_cpu", "build_draft_decode_metadata_cpu"):
            self.assertTrue(hasattr(torch.ops.sgl_kernel, name), name)

    def test_cuda_synchronize_without_cuda_waits_for_nothing(self):
        # SGLang's MLA EAGLE-3 drafter calls it in set_embed; on a machine with CUDA it is torch's.
        if torch.cuda.is_available():
            self.assertEqual(torch.cuda.synchronize.__module__, "torch.cuda")
        else:
            self.assertIsNone(torch.cuda.synchronize())
            self.assertIsNone(torch.cuda.synchronize(0))


if __name__ == "__main__":
    unittest.main()
