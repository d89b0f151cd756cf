"""The exact top-k teacher: merging per-shard top-k and logsumexp (the vocab-sharded head of
tensor parallelism, padding rows included) equals top-k of the full log-softmax."""

import unittest

import torch

from aerie_capture.teacher import merge_topk, shard_topk, topk_full


class Teacher(unittest.TestCase):
    def test_merge_across_vocab_shards_equals_the_full_log_softmax(self):
        g = torch.Generator().manual_seed(0)
        for vocab, tp, k in [(1000, 8, 16), (163840 // 64, 8, 64), (50, 4, 50), (37, 3, 5)]:
            logits = 4 * torch.randn(23, vocab, generator=g)
            want_ids, want_lp = topk_full(logits, k, chunk=7)
            ref = torch.log_softmax(logits.double(), -1).topk(k, -1)
            self.assertTrue(torch.equal(want_ids.long(), ref.indices))
            torch.testing.assert_close(want_lp.double(), ref.values, rtol=0, atol=1e-5)
            # SGLang's vocab-parallel head: equal shards of ceil(V / tp) rows, the last padded.
            per = -(-vocab // tp)
            padded = torch.cat([logits, torch.full((23, per * tp - vocab), 99.0)], -1)
            parts = [shard_topk(padded[:, r * per : (r + 1) * per], k, r * per, vocab) for r in reversed(range(tp))]
            ids, lp = merge_topk(parts, k)
            self.assertTrue(torch.equal(ids, want_ids), (vocab, tp, k))
            torch.testing.assert_close(lp, want_lp, rtol=0, atol=1e-5)
            self.assertTrue(bool((lp <= 0).all()) and bool((lp[:, 1:] <= lp[:, :-1]).all()))

    def test_too_few_candidates_is_an_error(self):
        parts = [shard_topk(torch.randn(2, 3), 5, 0, 3)]
        with self.assertRaises(ValueError):
            merge_topk(parts, 5)


if __name__ == "__main__":
    unittest.main()
