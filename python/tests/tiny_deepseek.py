"""A tiny random DeepSeek-V3 (transformers' own `DeepseekV3ForCausalLM`): MLA attention
(q and kv LoRA ranks), one dense layer then MoE layers with 8 routed experts (2 per token) and
one shared expert, untied head. Kimi-K2.5's text model has this architecture at 61 layers and
hidden 7168; here 6 layers, hidden 64, so a forward takes well under a second on a CPU.

`python tiny_deepseek.py DIR [VOCAB] [--mla-kernel-shapes]` writes it (config.json +
model.safetensors) into DIR; with the flag, in the latent width vLLM's MLA kernels take."""

from __future__ import annotations

import sys

import torch


def config(vocab: int = 512, layers: int = 6, mla_kernel_shapes: bool = False):
    """`mla_kernel_shapes`: DeepSeek-V3's latent width (kv_lora_rank 512 + rope 64), the only one
    vLLM's MLA kernels take."""
    from transformers import DeepseekV3Config

    mla = dict(kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32) if mla_kernel_shapes else dict(
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16
    )
    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=layers, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.827, norm_topk_prob=True,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, max_position_embeddings=4096,
        rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, **mla,
    )


def make(out: str, vocab: int = 512, seed: int = 0, mla_kernel_shapes: bool = False):
    import json
    from pathlib import Path

    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config(vocab, mla_kernel_shapes=mla_kernel_shapes)).eval()
    # Random init leaves the router's correction bias at 0 and the norms at 1: perturb them so
    # the routing and the norms are actually exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(0.05 * torch.randn_like(m.e_score_correction_bias))
    model.save_pretrained(out)
    # transformers routes by sigmoid scores with a correction bias without writing it down; vLLM
    # reads it from the config (DeepSeek-V3's and Kimi's configs say it).
    path = Path(out) / "config.json"
    c = json.loads(path.read_text())
    c.update(topk_method="noaux_tc", scoring_func="sigmoid")
    path.write_text(json.dumps(c, indent=2))
    return model


if __name__ == "__main__":
    args = [x for x in sys.argv[1:] if x != "--mla-kernel-shapes"]
    make(args[0], int(args[1]) if len(args) > 1 else 512, mla_kernel_shapes="--mla-kernel-shapes" in sys.argv)
