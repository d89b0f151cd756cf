"""scripts/specforge_finetune.py (SpecForge 0.2.0's training code on aerie shards) on a tiny
random drafter: the warm start's SGLang keys all land in SpecForge's LlamaForCausalLMEagle3 and a
0-step export is the warm start byte for byte; a trained export keeps the keys, dtypes and vocab
maps; a warm start with a key SpecForge has no place for, or lacking one, is refused.

Needs SpecForge's wheel (`bash scripts/gpu/fetch.sh` puts it in .work/gpu/; or
AERIE_SPECFORGE_WHEEL) and transformers; skipped, saying so, without them, except under CI=true
(`.ci/run` fetches the wheel), where a missing wheel fails."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
WHEEL = Path(os.environ.get("AERIE_SPECFORGE_WHEEL", REPO / ".work/gpu/specforge-0.2.0-py3-none-any.whl"))

H, HT, NH, NKV, D, I, V, VD, AUX = 64, 64, 4, 2, 16, 128, 512, 128, [0, 1, 2]


def have_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def drafter_config():
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": D,
        "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
        "vocab_size": V, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "torch_dtype": "float32", "draft_vocab_size": VD, "target_hidden_size": HT,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True},
        "norm_before_residual": False, "fc_norm": False, "norm_output": False,
    }


def drafter_tensors(seed):
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (0.05 * torch.randn(*shape, generator=g)).contiguous()

    ids = torch.arange(VD) * (V // VD)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    return {
        "d2t": ids - torch.arange(VD), "t2d": t2d,
        "fc.weight": w(H, 3 * HT), "lm_head.weight": w(VD, H), "norm.weight": 1 + w(H),
        "midlayer.hidden_norm.weight": 1 + w(H), "midlayer.input_layernorm.weight": 1 + w(H),
        "midlayer.post_attention_layernorm.weight": 1 + w(H),
        "midlayer.mlp.down_proj.weight": w(H, I), "midlayer.mlp.gate_proj.weight": w(I, H),
        "midlayer.mlp.up_proj.weight": w(I, H),
        "midlayer.self_attn.q_proj.weight": w(NH * D, 2 * H), "midlayer.self_attn.k_proj.weight": w(NKV * D, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(NKV * D, 2 * H), "midlayer.self_attn.o_proj.weight": w(H, NH * D),
    }


def write_drafter(d, tensors):
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(drafter_config(), indent=2))
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def write_target(d):
    """A tiny tied-embedding Llama target: its config and embedding (the head the teacher uses)."""
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HT, "intermediate_size": I,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "num_hidden_layers": 4, "vocab_size": V,
        "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
    }))
    g = torch.Generator().manual_seed(7)
    save_file({"model.embed_tokens.weight": torch.randn(V, HT, generator=g)}, str(d / "model.safetensors"))


def write_shards(d):
    from aerie_capture.shards import Metadata, ShardWriter, Teacher

    meta = Metadata(
        target="tiny", target_num_layers=4, target_vocab_size=V, aux_layer_ids=AUX, aux_convention="output-of-layer",
        hidden_size=HT, dtype="bf16", tokenizer_digest="ab" * 32, chat_template="chatml",
        teacher=Teacher.parse("final-hidden"), created_by="aerie-capture test",
    )
    w = ShardWriter.create(d, meta)
    g = torch.Generator().manual_seed(3)
    for i, t in enumerate([11, 17, 9]):
        mask = torch.zeros(t, dtype=torch.long)
        mask[t // 3:] = 1
        w.push(input_ids=torch.randint(0, V, (t,), generator=g), loss_mask=mask,
               aux_hidden=torch.randn(t, 3 * HT, generator=g), final_hidden=4 * torch.randn(t, HT, generator=g),
               sample_id=i)
    w.finish()


def read(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


if os.environ.get("CI") == "true" and not WHEEL.is_file():
    raise RuntimeError(f"CI=true: SpecForge's wheel is absent ({WHEEL}); .ci/run fetches it with scripts/gpu/fetch.sh")


@unittest.skipUnless(WHEEL.is_file(), f"SpecForge's wheel is absent ({WHEEL}; bash scripts/gpu/fetch.sh fetches it)")
@unittest.skipUnless(have_transformers(), "transformers is not installed (SpecForge's TargetHead reads the target config)")
class SpecForgeFinetune(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, str(REPO / "scripts"))
        import specforge_finetune

        cls.sf = specforge_finetune
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.warm, cls.target, cls.shards = root / "warm", root / "target", root / "shards"
        write_drafter(cls.warm, drafter_tensors(1))
        write_target(cls.target)
        write_shards(cls.shards)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_script(self, out, *extra, warm=None):
        args = ["--wheel", str(WHEEL), "--warm-start", str(warm or self.warm), "--target", str(self.target),
                "--shards", str(self.shards), "--out", str(out), "--epochs", "1", "--ttt-length", "2",
                "--seed", "0", "--json", *extra]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = self.sf.main(args)
        self.assertEqual(rc, 0, stderr.getvalue())
        return json.loads(stdout.getvalue())

    def test_zero_steps_is_the_warm_start_byte_for_byte(self):
        out = Path(self.tmp.name) / "zero"
        report = self.run_script(out, "--max-steps", "0")
        self.assertEqual(report["steps"], 0)
        self.assertEqual((out / "model.safetensors").read_bytes(), (self.warm / "model.safetensors").read_bytes())
        self.assertEqual((out / "config.json").read_bytes(), (self.warm / "config.json").read_bytes())
        self.assertEqual(json.loads((out / "specforge.json").read_text())["wheel_sha256"], self.sf.sha256(WHEEL))
        self.assertEqual(sorted(p.name for p in out.parent.iterdir() if p.name.startswith("zero.")), [])

    def test_training_keeps_keys_dtypes_and_vocab_maps(self):
        out = Path(self.tmp.name) / "two"
        report = self.run_script(out, "--max-steps", "2")
        self.assertEqual(report["steps"], 2)
        warm, got = read(self.warm / "model.safetensors"), read(out / "model.safetensors")
        self.assertEqual(sorted(got), sorted(warm))
        for k, t in warm.items():
            self.assertEqual((got[k].dtype, tuple(got[k].shape)), (t.dtype, tuple(t.shape)), k)
        self.assertTrue(torch.equal(got["d2t"], warm["d2t"]) and torch.equal(got["t2d"], warm["t2d"]))
        self.assertFalse(torch.equal(got["fc.weight"], warm["fc.weight"]), "two steps at lr 5e-4 left fc unchanged")

    def test_every_key_must_be_consumed_and_every_weight_filled(self):
        for name, change in (("extra", lambda t: {**t, "midlayer.extra.weight": torch.zeros(3)}),
                             ("missing", lambda t: {k: v for k, v in t.items() if k != "norm.weight"})):
            warm = Path(self.tmp.name) / f"warm-{name}"
            write_drafter(warm, change(drafter_tensors(1)))
            with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()):
                self.run_script(Path(self.tmp.name) / f"out-{name}", "--max-steps", "0", warm=warm)
            self.assertIn("midlayer.extra.weight" if name == "extra" else "norm.weight", str(e.exception))


if __name__ == "__main__":
    unittest.main()
