"""The SGLang engine's pure functions, without SGLang: the layer numbering per model class,
splitting packed rows, the vocab shard layout, and what the seam check says when SGLang is
missing."""

import unittest

import torch

from aerie_capture.engines.sglang import check_api, layers_to_capture, sglang_eagle3_rule, split_packed, vocab_shard


class LayerIds(unittest.TestCase):
    def test_kimi_aux_layers_capture_hf_hidden_states_2_30_58(self):
        # Kimi-K2.5: 61 layers, aerie's [1, 29, 57] output-of-layer = SGLang input-of-layer [2, 30, 58].
        self.assertEqual(layers_to_capture([1, 29, 57], 61), [2, 30, 58])
        for arch in ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"):
            self.assertEqual(sglang_eagle3_rule(arch, [1, 29, 57], 61), [2, 30, 58])

    def test_the_deepseek_first_id_rule_differs_from_llama(self):
        # DeepSeek reads ids as input-of-layer unless the first is 1; aerie sets them explicitly.
        self.assertEqual(sglang_eagle3_rule("DeepseekV3ForCausalLM", [0, 2, 3], 6), [0, 2, 3])
        self.assertEqual(layers_to_capture([0, 2, 3], 6), [1, 3, 4])
        self.assertEqual(sglang_eagle3_rule("LlamaForCausalLM", [0, 2, 3], 6), [1, 3, 4])
        self.assertEqual(sglang_eagle3_rule("Qwen3MoeForCausalLM", [1, 2], 6), [2, 3])
        self.assertEqual(sglang_eagle3_rule("DeepseekV3ForCausalLM", None, 61), [2, 30, 58])


class Packing(unittest.TestCase):
    def test_split_packed_rows_in_order(self):
        rows = torch.arange(9 * 2).reshape(9, 2)
        parts = split_packed(rows, [2, 4, 3])
        self.assertEqual([p.shape[0] for p in parts], [2, 4, 3])
        self.assertTrue(torch.equal(torch.cat(parts), rows))
        self.assertTrue(torch.equal(parts[1][0], rows[2]))
        for lens in ([2, 4], [2, 4, 4], [9, 0]):
            with self.assertRaises(ValueError):
                split_packed(rows, lens)

    def test_vocab_shards_cover_the_padded_vocabulary(self):
        self.assertEqual(vocab_shard(163840, 8, 0), (0, 20480))
        self.assertEqual(vocab_shard(163840, 8, 7), (143360, 163840))
        self.assertEqual(vocab_shard(1000, 8, 7), (896, 1024))  # 1000 padded to 1024
        with self.assertRaises(ValueError):
            vocab_shard(64, 3, 0)


class Seams(unittest.TestCase):
    def test_without_sglang_the_seam_check_says_what_to_install(self):
        try:
            import sglang  # noqa: F401
        except ImportError:
            problems = check_api()
            self.assertEqual(len(problems), 1)
            self.assertIn("sglang==0.5.23", problems[0])
        else:
            # With SGLang installed (the GPU host), every seam must be there.
            self.assertEqual(check_api(), [])


if __name__ == "__main__":
    unittest.main()
