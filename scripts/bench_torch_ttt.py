#!/usr/bin/env python3
"""PyTorch-eager baseline for `aerie bench ttt`: the same EAGLE-3 training-time-test (TTT)
forward + backward (eagle3.md §3, crates/aerie-model/src/ttt.rs), timed the same way.

Not part of the build or the tests: it only answers "how fast is PyTorch eager on this CPU for
the same work". Needs `torch` (the PyPI wheel works on CPU) and nothing else.

    python scripts/bench_torch_ttt.py --shape smollm2 --seq-len 512 --steps 3 [--threads 2] [--json]

Same drafter shape, same K-step unroll (prefix keys causal + one diagonal key per earlier step,
GQA, RoPE at position t + k, RMSNorm, SwiGLU, draft-vocab head), same per-step loss (soft CE
against the shifted teacher p, α = Σ min(pf, q), argmax accuracy), same FLOP count as aerie's
`ttt_flops_per_token`, and the same warm-up/median timing. The teacher (p, pf, in_draft) is
made before timing, as in aerie's bench.
"""

import argparse
import json
import math
import resource
import time

import torch
import torch.nn.functional as F

from ttt_flops import flops_per_token  # scripts/ttt_flops.py, beside this script

SHAPES = {
    # hidden, target_hidden, aux, inter, heads, kv_heads, head_dim, vocab, draft_vocab, theta
    "smollm2": dict(h=576, ht=576, aux=3, i=1536, nh=9, nkv=3, d=64, v=49152, vd=8192, theta=100000.0),
    "kimi": dict(h=7168, ht=7168, aux=3, i=18432, nh=64, nkv=64, d=128, v=163840, vd=32000, theta=50000.0),
}


class Drafter(torch.nn.Module):
    def __init__(self, s, embed_vocab):
        super().__init__()
        h, d = s["h"], s["d"]
        lin = lambda o, i: torch.nn.Parameter(torch.randn(o, i) * 0.02)
        self.s = s
        self.embed = torch.randn(embed_vocab, h) * 0.02  # frozen target embedding
        self.fc = lin(h, s["aux"] * s["ht"])
        self.ln_in = torch.nn.Parameter(torch.ones(h))
        self.ln_hidden = torch.nn.Parameter(torch.ones(h))
        self.q = lin(s["nh"] * d, 2 * h)
        self.k = lin(s["nkv"] * d, 2 * h)
        self.v = lin(s["nkv"] * d, 2 * h)
        self.o = lin(h, s["nh"] * d)
        self.ln_post = torch.nn.Parameter(torch.ones(h))
        self.gate = lin(s["i"], h)
        self.up = lin(s["i"], h)
        self.down = lin(h, s["i"])
        self.norm = torch.nn.Parameter(torch.ones(h))
        self.head = lin(s["vd"], h)
        inv = 1.0 / (s["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        self.inv_freq = inv


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def tables(m, start, l):
    pos = torch.arange(start, start + l, dtype=torch.float64)
    f = torch.outer(pos, m.inv_freq)
    emb = torch.cat((f, f), -1)
    return emb.cos().float(), emb.sin().float()


def shift(x, k, pad):
    if k == 0:
        return x
    l = x.shape[1]
    padding = torch.full((x.shape[0], min(k, l)) + tuple(x.shape[2:]), pad, dtype=x.dtype)
    return torch.cat((x[:, k:], padding), 1)


def ttt_forward(m, ids, mask, aux, p, pf, in_draft, k_steps, decay=0.8):
    s = m.s
    b, l = ids.shape
    nh, nkv, d = s["nh"], s["nkv"], s["d"]
    g = nh // nkv
    vd = s["vd"]
    ids = shift(ids, 1, 0)
    mm = mask * shift(torch.ones_like(mask), 1, 0.0)
    p = shift(p, 1, 1.0 / vd)
    pf = shift(pf, 1, 0.0)
    pm = mm * shift(in_draft, 1, 0.0)
    causal = torch.ones(l, l, dtype=torch.bool).triu(1)
    hidden = aux @ m.fc.T
    keys, values = [], []
    loss = 0.0
    positions = b * l
    for k in range(k_steps):
        ids_k, pm_k = shift(ids, k, 0), shift(pm, k, 0.0)
        p_k, pf_k = shift(p, k, 1.0 / vd), shift(pf, k, 0.0)
        cos, sin = tables(m, k, l)
        emb = m.embed[ids_k]
        x = torch.cat((rms(emb, m.ln_in), rms(hidden, m.ln_hidden)), -1)
        q = rope((x @ m.q.T).view(b, l, nh, d).transpose(1, 2), cos, sin)
        kk = rope((x @ m.k.T).view(b, l, nkv, d).transpose(1, 2), cos, sin)
        vv = (x @ m.v.T).view(b, l, nkv, d).transpose(1, 2)
        keys.append(kk)
        values.append(vv)
        q = q.reshape(b, nkv, g * l, d) / math.sqrt(d)  # query head j -> kv head j // g
        k0, v0 = keys[0], values[0]
        scores = [(q @ k0.transpose(2, 3)).masked_fill(causal.repeat(g, 1), float("-inf"))]
        for kd in keys[1:]:
            scores.append((q * kd.repeat(1, 1, g, 1)).sum(-1, keepdim=True))
        w = torch.softmax(torch.cat(scores, -1), -1)
        out = w[..., :l] @ v0
        for j, vd_ in enumerate(values[1:]):
            out = out + w[..., l + j : l + j + 1] * vd_.repeat(1, 1, g, 1)
        out = out.reshape(b, nh, l, d).transpose(1, 2).reshape(b, l, nh * d)
        h = hidden + out @ m.o.T
        y = rms(h, m.ln_post)
        h = h + (F.silu(y @ m.gate.T) * (y @ m.up.T)) @ m.down.T
        logq = torch.log_softmax(rms(h, m.norm) @ m.head.T, -1)
        hidden = h
        ce_tok = pm_k * -(p_k * logq).sum(-1)
        alpha_tok = pm_k * torch.minimum(logq.exp(), pf_k).sum(-1)
        hit = (logq.detach().argmax(-1) == p_k.argmax(-1)).float()
        _correct = (pm_k * hit).sum()
        _alpha = alpha_tok.sum()
        loss = loss + ce_tok.sum() * (decay**k / positions)
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ttt-length", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--embed-vocab", type=int, default=0, help="rows of the frozen embedding (0: the target vocab)")
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    s = SHAPES[a.shape]
    b, l = a.batch, a.seq_len
    m = Drafter(s, a.embed_vocab or s["v"])
    with torch.no_grad():
        teacher_logits = torch.randn(b, l, s["vd"])
        p = torch.softmax(teacher_logits, -1)
        pf = p * 0.9
        in_draft = torch.ones(b, l)
    ids = torch.randint(0, m.embed.shape[0], (b, l))
    mask = torch.ones(b, l)
    aux = torch.randn(b, l, s["aux"] * s["ht"])
    times = []
    for it in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        if a.forward_only:
            with torch.no_grad():
                loss = ttt_forward(m, ids, mask, aux, p, pf, in_draft, a.ttt_length)
        else:
            m.zero_grad(set_to_none=True)
            loss = ttt_forward(m, ids, mask, aux, p, pf, in_draft, a.ttt_length)
            loss.backward()
            _ = m.head.grad.sum().item()
        if it >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    fwd = flops_per_token(s, l, a.ttt_length)
    fpt = fwd if a.forward_only else 3.0 * fwd
    tps = b * l / med
    report = dict(
        backend=f"torch {torch.__version__} eager cpu ({torch.get_num_threads()} threads)",
        shape=a.shape,
        seq_len=l,
        batch=b,
        ttt_length=a.ttt_length,
        backward=not a.forward_only,
        step_seconds=times,
        median_step_seconds=med,
        tokens_per_second=tps,
        flops_per_token=fpt,
        achieved_gflops=fpt * tps / 1e9,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    )
    if a.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['backend']} {a.shape} L={l} B={b} K={a.ttt_length} "
            f"{'fwd' if a.forward_only else 'fwd+bwd'}: {tps:.1f} tokens/s ({med:.3f} s/step), "
            f"{fpt / 1e9:.2f} GFLOP/token, {report['achieved_gflops']:.1f} GFLOP/s, "
            f"peak RSS {report['peak_rss_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
