"""The transformers engine on a tiny random DeepSeek-V3 (MLA, routed + shared experts, the
architecture of Kimi-K2.5's text model): its aux rows are the decoder layers' outputs as forward
hooks see them, its final rows the final norm's output, its top-k the top-k of a full
log-softmax of the model's logits."""

import sys
import tempfile
import unittest
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import tiny_deepseek  # noqa: E402

from aerie_capture.engines.hf import TransformersEngine  # noqa: E402


class TinyDeepseekV3(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tiny_deepseek.make(cls.tmp.name, vocab=512, seed=3)
        cls.engine = TransformersEngine(cls.tmp.name, [1, 2, 3], final_hidden=True, topk=16)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_config_is_mla_with_routed_and_shared_experts(self):
        c = self.engine.model.config
        self.assertEqual(type(self.engine.model).__name__, "DeepseekV3ForCausalLM")
        self.assertEqual((c.q_lora_rank, c.kv_lora_rank, c.n_routed_experts, c.n_shared_experts), (32, 16, 8, 1))
        self.assertEqual(self.engine.info.num_layers, 6)

    def test_aux_equals_forward_hooks_and_final_equals_the_final_norm(self):
        model = self.engine.model
        seen = {}

        def hook(k):
            def f(_module, _inputs, output):
                seen[k] = (output[0] if isinstance(output, tuple) else output).detach().clone()

            return f

        handles = [layer.register_forward_hook(hook(k)) for k, layer in enumerate(model.model.layers)]
        try:
            g = torch.Generator().manual_seed(1)
            batch = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 7, 33)]
            for ids in batch:
                seen.clear()
                (out,) = self.engine.capture([ids])
                self.assertEqual(tuple(out.aux.shape), (len(ids), 3 * 64))
                want = torch.cat([seen[k][0] for k in (1, 2, 3)], -1)
                self.assertTrue(torch.equal(out.aux, want), "aux differs from the hooked layer outputs")
                with torch.no_grad():
                    normed = model.model.norm(seen[5])[0]
                torch.testing.assert_close(out.final, normed, rtol=0, atol=0)
                # Hidden states vary by layer (the capture is not one tensor repeated).
                self.assertFalse(torch.allclose(out.aux[:, :64], out.aux[:, 64:128]))

                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids])).logits[0].double()
                ref = torch.log_softmax(logits, -1).topk(16, -1)
                self.assertTrue(torch.equal(out.topk_ids.long(), ref.indices))
                torch.testing.assert_close(out.topk_logprobs.double(), ref.values, rtol=0, atol=1e-5)
                lp = out.topk_logprobs
                self.assertTrue(bool((lp <= 0).all()) and bool((lp[:, 1:] <= lp[:, :-1]).all()))
        finally:
            for h in handles:
                h.remove()

    def test_without_a_top_k_teacher_the_rows_are_the_same(self):
        # That path skips the [T, V] head (`logits_to_keep=1`); the hidden states must not change.
        lean = TransformersEngine(self.tmp.name, [1, 2, 3], final_hidden=True, topk=None)
        ids = list(range(5, 30))
        (a,) = self.engine.capture([ids])
        (b,) = lean.capture([ids])
        self.assertTrue(torch.equal(a.aux, b.aux) and torch.equal(a.final, b.final))
        self.assertIsNone(b.topk_ids)
        self.assertTrue(lean._keep_ok)


if __name__ == "__main__":
    unittest.main()
