"""The vLLM engine's pure parts and its vLLM seams, without starting vLLM: the layer-id mapping
between aerie's output-of-layer ids and vLLM's input-of-layer ones (Kimi's [1, 29, 57] included),
splitting a file's rows, the final norm against transformers' own, the checkpoint names of the
norm and head, `check_api()` against the installed vLLM, and the CPU connector's copy against
vLLM's own extraction and file reader. The engine itself runs against real vLLM in
crates/aerie-cli/tests/vllm.rs."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import unittest
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aerie_capture.engines.vllm import capture_model_len, head_weight_names, rms_norm, split_rows, vllm_layer_ids  # noqa: E402

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
IN_CI = os.environ.get("CI") == "true"


class LayerIds(unittest.TestCase):
    def test_output_of_layer_ids_become_input_of_layer_ids_then_the_last_layer(self):
        self.assertEqual(vllm_layer_ids([1, 14, 26], 30), [2, 15, 27, 30])
        # Kimi-K2.5: 61 layers, aerie's (and AQ-MedAI's) [1, 29, 57] = HF hidden_states[2, 30, 58].
        self.assertEqual(vllm_layer_ids([1, 29, 57], 61), [2, 30, 58, 61])
        # Output of layer 0 (the first id vLLM can name is 1; 0 is the embedding).
        self.assertEqual(vllm_layer_ids([0, 2], 6), [1, 3, 6])

    def test_the_last_layer_and_bad_orders_are_refused(self):
        with self.assertRaises(ValueError):
            vllm_layer_ids([1, 29], 30)  # output of the last layer is only seen after the norm
        with self.assertRaises(ValueError):
            vllm_layer_ids([3, 1], 30)
        with self.assertRaises(ValueError):
            vllm_layer_ids([], 30)


class ModelLen(unittest.TestCase):
    def test_the_context_is_the_longest_sample_within_the_model(self):
        # Kimi-K2.5's 262,144 positions: a KV cache no CPU holds; the prepared data's 4,096 tokens
        # and the one generated token are what a capture needs.
        self.assertEqual(capture_model_len({"max_position_embeddings": 262144}, 4096), 4097)
        self.assertEqual(capture_model_len({"max_position_embeddings": 2048}, 4096), 2048)
        self.assertEqual(capture_model_len({}, 100), 101)
        self.assertIsNone(capture_model_len({"max_position_embeddings": 2048}, None))


class Rows(unittest.TestCase):
    def test_split_keeps_aux_low_to_high_and_the_last_layer_apart(self):
        t, h = 5, 4
        hs = torch.arange(t * 3 * h, dtype=torch.float32).view(t, 3, h)
        aux, last = split_rows(hs, 2)
        self.assertEqual(tuple(aux.shape), (t, 2 * h))
        self.assertTrue(torch.equal(aux[:, :h], hs[:, 0]))
        self.assertTrue(torch.equal(aux[:, h:], hs[:, 1]))
        self.assertTrue(torch.equal(last, hs[:, 2]))
        with self.assertRaises(ValueError):
            split_rows(hs, 3)  # a file without the last layer

    def test_rms_norm_is_transformers_own(self):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        torch.manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            ref = LlamaRMSNorm(64, eps=1e-5).to(dtype)
            with torch.no_grad():
                ref.weight.copy_(1 + 0.1 * torch.randn(64))
            x = (3 * torch.randn(7, 64)).to(dtype)
            self.assertTrue(torch.equal(rms_norm(x, ref.weight.detach(), 1e-5), ref(x).detach()), dtype)

    def test_norm_and_head_names(self):
        self.assertEqual(head_weight_names({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True}),
                         ("model.norm.weight", "model.embed_tokens.weight"))
        self.assertEqual(head_weight_names({"architectures": ["DeepseekV3ForCausalLM"]}), ("model.norm.weight", "lm_head.weight"))
        kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}}
        self.assertEqual(head_weight_names(kimi), ("language_model.model.norm.weight", "language_model.lm_head.weight"))


@unittest.skipUnless(HAVE_VLLM or IN_CI, "vllm is not installed (python/requirements-test.txt)")
class Seams(unittest.TestCase):
    def test_every_vllm_seam_is_there(self):
        from aerie_capture.engines.vllm import check_api

        self.assertEqual(check_api(), [])

    def test_the_cpu_connector_writes_what_vllm_reads(self):
        """The CPU subclass's copy, file and lock, driven on a hand-made cache: the rows of the
        request's blocks, in slot order, as vLLM's own `extract_from_kv_cache` gives them, read
        back by vLLM's `load_hidden_states`, and both files gone after `cleanup_hidden_states`."""
        from concurrent.futures import ThreadPoolExecutor

        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            PendingSave,
            cleanup_hidden_states,
            extract_from_kv_cache,
            load_hidden_states,
        )

        from aerie_capture.engines.vllm_connector import AerieCpuHiddenStatesConnector

        block, layers, h = 4, 3, 8
        cache = torch.randn(6, layers, block, h)  # [blocks, "heads" = layers, block, H]
        c = object.__new__(AerieCpuHiddenStatesConnector)  # no VllmConfig: only the copy runs
        c._is_tp_rank_zero, c._kv_cache, c._block_size = True, cache, block
        c._lock_fds, c._req_futures, c._req_copy_events = {}, {}, {}
        c.use_lock, c._executor = True, ThreadPoolExecutor(1)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r1.safetensors")
            ids = torch.tensor([5, 6, 7, 8, 9, 10])
            c._submit_async_write(PendingSave("r1", path, ids, [4, 1]))
            data = load_hidden_states(path)
            slots = torch.tensor([16, 17, 18, 19, 4, 5])
            want = extract_from_kv_cache(cache, slots, 6)
            self.assertTrue(torch.equal(want, torch.cat([cache[4].transpose(0, 1), cache[1].transpose(0, 1)])[:6]))
            self.assertTrue(torch.equal(data["hidden_states"], want))
            self.assertTrue(torch.equal(data["token_ids"], ids))
            self.assertTrue(c._req_copy_events["r1"].query())
            c._executor.shutdown(wait=True)
            cleanup_hidden_states(path)
            self.assertEqual(os.listdir(d), [])


if __name__ == "__main__":
    unittest.main()
