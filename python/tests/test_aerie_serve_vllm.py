"""`python -m aerie_serve vllm serve`: the attention backend it adds for a float32 MLA model on a
CPU (vLLM's AMX MLA backend, chosen wherever the CPU has AMX tiles, loads bf16/f16/int8 weights
only), and the seam it relies on in the installed vLLM (skipped where vLLM is not installed)."""

import importlib.util
import json
import os
import tempfile
import unittest

import aerie_serve.__main__ as launcher

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def model(d: str, **config) -> str:
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return d


class CpuMlaArguments(unittest.TestCase):
    def test_a_float32_mla_model_on_a_cpu_gets_the_reference_backend(self):
        with tempfile.TemporaryDirectory() as d:
            m = model(d, model_type="deepseek_v3", kv_lora_rank=512)
            for dtype in (["--dtype", "float32"], ["--dtype=float32"]):
                args = ["serve", m, "--enforce-eager", *dtype]
                self.assertEqual(launcher.cpu_mla_args(args, True), [*args, "--attention-backend", "CPU_MLA"])
            # The drafter too, in both spellings of the speculative config; a backend it names stays.
            spec = json.dumps({"method": "eagle3", "model": "drafter", "num_speculative_tokens": 3})
            for form in (["--speculative-config", spec], ["--speculative-config=" + spec]):
                out = launcher.cpu_mla_args(["serve", m, "--dtype", "float32", *form], True)
                given = json.loads(out[5] if len(form) == 2 else out[4].split("=", 1)[1])
                self.assertEqual(given["attention_backend"], "CPU_MLA")
                self.assertEqual(given["num_speculative_tokens"], 3)
            named = json.dumps({"method": "eagle3", "attention_backend": "CPU_ATTN"})
            out = launcher.cpu_mla_args(["serve", m, "--dtype", "float32", "--speculative-config", named], True)
            self.assertEqual(out[5], named)
            # Kimi-K2.5 declares it in text_config.
            m = model(d, model_type="kimi_k25", text_config={"kv_lora_rank": 512})
            self.assertEqual(launcher.cpu_mla_args(["serve", m, "--dtype", "float32"], True)[-1], "CPU_MLA")

    def test_nothing_changes_elsewhere(self):
        with tempfile.TemporaryDirectory() as d:
            mla = model(d, model_type="deepseek_v3", kv_lora_rank=512)
            f32 = ["--dtype", "float32"]
            for args, on_cpu in [
                (["serve", mla, *f32], False),  # a GPU
                (["serve", mla, "--dtype", "bfloat16"], True),
                (["serve", mla], True),  # the engine's own dtype
                (["serve", mla, *f32, "--attention-backend", "CPU_ATTN"], True),
                (["--version"], True),
            ]:
                self.assertEqual(launcher.cpu_mla_args(args, on_cpu), args)
        with tempfile.TemporaryDirectory() as d:
            llama = model(d, model_type="llama", hidden_size=64)
            args = ["serve", llama, "--dtype", "float32"]
            self.assertEqual(launcher.cpu_mla_args(args, True), args)


@unittest.skipUnless(HAVE_VLLM, "vLLM is not installed in this Python")
class VllmSeam(unittest.TestCase):
    def test_the_cpu_platform_honours_cpu_mla_for_mla_models(self):
        from vllm.platforms.cpu import CpuPlatform
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        class Selector:
            use_sparse = False
            use_mla = True

        path = CpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CPU_MLA, Selector())
        self.assertEqual(path, AttentionBackendEnum.CPU_MLA.get_path())

    def test_the_speculative_config_takes_the_drafters_backend(self):
        import dataclasses

        from vllm.config import SpeculativeConfig

        self.assertIn("attention_backend", {f.name for f in dataclasses.fields(SpeculativeConfig)})


if __name__ == "__main__":
    unittest.main()
