"""An independent PyTorch reference of the MLA EAGLE-3 drafter's training-time test (TTT).

Written from the published model definitions, not from aerie's Rust: DeepSeek-V2/V3 multi-latent
attention (q_a_proj -> q_a_layernorm -> q_b_proj; kv_a_proj_with_mqa -> kv_a_layernorm ->
kv_b_proj; one RoPE key shared by every head; RoPE on interleaved pairs (2i, 2i+1) as vLLM and
SGLang run DeepSeek (`is_neox_style=False`); YaRN frequencies and mscale as DeepSeek's
`DeepseekV3YarnRotaryEmbedding`; softmax scale qk_head_dim^-0.5 * mscale(factor,
mscale_all_dim)^2), inside the EAGLE-3 layer of SGLang's `Eagle3DeepseekV2ForCausalLM`
(attention input cat(input_layernorm(emb), hidden_norm(h)), residual h, SwiGLU MLP, final norm,
draft head; EAGLE-3.1 `fc_norm` and `norm_output`).

The TTT objective (eagle3.md section 3) is written with one explicit score matrix per step: step
k's queries see the step-0 keys causally and the keys of steps 1..k at their own position only,
all in one softmax. Everything runs in float64 with torch autograd.

`python mla_eagle3.py --self-check` first checks this file's MLA attention against transformers' own
`DeepseekV3Attention` (interleaved RoPE, YaRN with mscale / mscale_all_dim, its softmax scale) and
prints the largest difference; transformers builds its RoPE frequencies in float32, so the two
agree to about 1e-7, not to float64 rounding.

Usage: python mla_eagle3.py IN.json OUT.json. IN holds `config`, `weights` ({name: {shape,
data}}, canonical names), `ids` [B][L], `aux` [B][L][A*Ht], `p` [B][L][Vd] (teacher, unshifted),
`loss_mask` [B][L], `step_weights`. OUT holds `loss`, `ce` [K][B][L] (per-position soft CE times
the mask, the aerie `ce_tok`), `alpha` [K][B][L] (sum_v min(q, p) times the mask) and `grads`
({name: flat list}) of the loss.
"""

import json
import math
import sys

import torch

torch.set_default_dtype(torch.float64)


def rms(x, w, eps):
    return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def yarn_mscale(scale, m):
    return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0


def rope_tables(cfg, positions):
    """cos/sin per position and frequency index i (the pair (2i, 2i+1)), DeepSeek's YaRN."""
    dim, base = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    idx = torch.arange(0, dim, 2, dtype=torch.float64)
    extra = 1.0 / (base ** (idx / dim))
    y = cfg.get("yarn")
    scale = 1.0
    if y:
        factor, orig = y["factor"], y["original_max_position_embeddings"]
        inter = 1.0 / (factor * base ** (idx / dim))

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(corr_dim(y["beta_fast"])), 0)
        high = min(math.ceil(corr_dim(y["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        mask = 1.0 - ramp
        inv = inter * (1 - mask) + extra * mask
        scale = yarn_mscale(factor, y["mscale"]) / yarn_mscale(factor, y["mscale_all_dim"])
    else:
        inv = extra
    ang = torch.tensor(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang) * scale, torch.sin(ang) * scale


def rope_interleaved(x, cos, sin):
    """Rotate pairs (x[2i], x[2i+1]) by angle i; x [..., L, d], cos/sin [L, d/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    r0 = x0 * cos - x1 * sin
    r1 = x1 * cos + x0 * sin
    return torch.stack([r0, r1], dim=-1).flatten(-2)


def softmax_scale(cfg):
    s = 1.0 / math.sqrt(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
    y = cfg.get("yarn")
    if y and y.get("mscale_all_dim"):
        m = yarn_mscale(y["factor"], y["mscale_all_dim"])
        s = s * m * m
    return s


def mla(W, cfg, x, positions):
    """q, k, v per head: [B, nH, L, d] each, for x [B, L, 2H]."""
    B, L, _ = x.shape
    nh, dn, dr, dv = cfg["num_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    eps = cfg["rms_norm_eps"]
    a = "midlayer.self_attn."
    q = x @ W[a + "q_a_proj.weight"].T
    q = rms(q, W[a + "q_a_layernorm.weight"], eps) @ W[a + "q_b_proj.weight"].T
    q = q.view(B, L, nh, dn + dr).transpose(1, 2)
    q_nope, q_pe = q[..., :dn], q[..., dn:]
    latent = x @ W[a + "kv_a_proj_with_mqa.weight"].T
    c, k_pe = latent[..., : cfg["kv_lora_rank"]], latent[..., cfg["kv_lora_rank"] :]
    kv = rms(c, W[a + "kv_a_layernorm.weight"], eps) @ W[a + "kv_b_proj.weight"].T
    kv = kv.view(B, L, nh, dn + dv).transpose(1, 2)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    cos, sin = rope_tables(cfg, positions)
    q_pe = rope_interleaved(q_pe, cos, sin)
    k_pe = rope_interleaved(k_pe[:, None, :, :], cos, sin).expand(B, nh, L, dr)
    return torch.cat([q_nope, q_pe], -1), torch.cat([k_nope, k_pe], -1), v


def shift_left(x, k, fill):
    if k == 0:
        return x
    L = x.shape[1]
    pad = torch.full((x.shape[0], min(k, L)) + tuple(x.shape[2:]), fill, dtype=x.dtype)
    if k >= L:
        return pad
    return torch.cat([x[:, k:], pad], 1)


def ttt(W, cfg, ids, aux, p, loss_mask, step_weights):
    eps = cfg["rms_norm_eps"]
    B, L = ids.shape
    A, Ht, Vd = cfg["num_aux"], cfg["target_hidden_size"], p.shape[-1]
    if cfg["fc_norm"]:
        aux = torch.cat([rms(aux[..., i * Ht : (i + 1) * Ht], W[f"fc_norm.{i}.weight"], eps) for i in range(A)], -1)
    hidden = aux @ W["fc.weight"].T
    ids1 = shift_left(ids, 1, 0)
    valid = torch.ones(B, L)
    m = loss_mask * shift_left(valid, 1, 0.0)
    pm = m  # every teacher argmax is in the draft vocabulary here
    p1 = shift_left(p, 1, 1.0 / Vd)
    positions = B * L
    scale = softmax_scale(cfg)
    keys, values = [], []
    loss = torch.zeros(())
    ce_steps, alpha_steps = [], []
    t = torch.arange(L)
    causal = t[None, :] <= t[:, None]  # [query t, key s]
    diag = t[None, :] == t[:, None]
    for k, wk in enumerate(step_weights):
        emb = W["embed_tokens.weight"][shift_left(ids1, k, 0)]
        x = torch.cat([rms(emb, W["midlayer.input_layernorm.weight"], eps), rms(hidden, W["midlayer.hidden_norm.weight"], eps)], -1)
        q, kk, v = mla(W, cfg, x, [pos + k for pos in range(L)])
        keys.append(kk)
        values.append(v)
        scores, vals = [], []
        for j in range(k + 1):
            s = (q @ keys[j].transpose(-1, -2)) * scale
            s = s.masked_fill(~(causal if j == 0 else diag), float("-inf"))
            scores.append(s)
            vals.append(values[j])
        probs = torch.softmax(torch.cat(scores, -1), -1)
        out = probs @ torch.cat(vals, 2)
        out = out.transpose(1, 2).reshape(B, L, -1)
        h = hidden + out @ W["midlayer.self_attn.o_proj.weight"].T
        y = rms(h, W["midlayer.post_attention_layernorm.weight"], eps)
        gate = y @ W["midlayer.mlp.gate_proj.weight"].T
        up = y @ W["midlayer.mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ W["midlayer.mlp.down_proj.weight"].T
        normed = rms(h, W["norm.weight"], eps)
        logq = torch.log_softmax(normed @ W["lm_head.weight"].T, -1)
        pk, pmk = shift_left(p1, k, 1.0 / Vd), shift_left(pm, k, 0.0)
        ce = -(pk * logq).sum(-1) * pmk
        alpha = torch.minimum(logq.exp(), pk).sum(-1) * pmk
        loss = loss + wk * ce.sum() / positions
        ce_steps.append(ce.detach().tolist())
        alpha_steps.append(alpha.detach().tolist())
        hidden = normed if cfg["norm_output"] else h
    return loss, ce_steps, alpha_steps


def self_check():
    """This file's MLA attention (causal, one step) against transformers' DeepseekV3Attention."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    torch.manual_seed(0)
    width, nh, ql, kvl, dn, dr, dv, L, start = 20, 2, 10, 6, 6, 8, 4, 7, 3
    yarn = {"factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 0.8}
    hf = DeepseekV3Config(
        hidden_size=width, num_attention_heads=nh, num_key_value_heads=nh, q_lora_rank=ql, kv_lora_rank=kvl,
        qk_nope_head_dim=dn, qk_rope_head_dim=dr, v_head_dim=dv, rope_theta=10000.0,
        rope_scaling=dict(rope_type="yarn", **yarn), max_position_embeddings=32, rms_norm_eps=1e-6,
        attention_bias=False,
    )
    hf._attn_implementation = "eager"
    assert getattr(hf, "rope_interleave", True), "transformers' DeepSeek-V3 must rotate interleaved pairs"
    attn = ds.DeepseekV3Attention(hf, 0).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(0.3 * torch.randn_like(p) + (1.0 if p.dim() == 1 else 0.0))
    x = torch.randn(1, L, width)
    cos, sin = ds.DeepseekV3RotaryEmbedding(hf).double()(x, torch.arange(L)[None] + start)
    mask = torch.full((L, L), float("-inf")).triu(1)[None, None]
    want, _ = attn(x, (cos, sin), mask)
    W = {"midlayer.self_attn." + n: p.detach() for n, p in attn.named_parameters()}
    cfg = {"num_heads": nh, "q_lora_rank": ql, "kv_lora_rank": kvl, "qk_nope_head_dim": dn,
           "qk_rope_head_dim": dr, "v_head_dim": dv, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "yarn": yarn}
    q, k, v = mla(W, cfg, x, [t + start for t in range(L)])
    probs = torch.softmax((q @ k.transpose(-1, -2)) * softmax_scale(cfg) + mask, -1)
    got = (probs @ v).transpose(1, 2).reshape(1, L, -1) @ W["midlayer.self_attn.o_proj.weight"].T
    diff = ((got - want).abs().max() / want.abs().max()).item()
    print(f"max relative difference to transformers' DeepseekV3Attention: {diff:.2e}")
    assert diff < 1e-5, diff
    assert abs(attn.scaling - softmax_scale(cfg)) < 1e-15, (attn.scaling, softmax_scale(cfg))


def main():
    if sys.argv[1] == "--self-check":
        self_check()
        return
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        inp = json.load(f)
    cfg = inp["config"]
    W = {
        name: torch.tensor(t["data"]).view(t["shape"]).requires_grad_(name != "embed_tokens.weight")
        for name, t in inp["weights"].items()
    }
    ids = torch.tensor(inp["ids"], dtype=torch.long)
    aux = torch.tensor(inp["aux"])
    p = torch.tensor(inp["p"])
    mask = torch.tensor(inp["loss_mask"])
    loss, ce, alpha = ttt(W, cfg, ids, aux, p, mask, inp["step_weights"])
    loss.backward()
    grads = {n: w.grad.flatten().tolist() for n, w in W.items() if w.grad is not None}
    with open(dst, "w") as f:
        json.dump({"loss": loss.item(), "ce": ce, "alpha": alpha, "grads": grads}, f)


if __name__ == "__main__":
    main()
