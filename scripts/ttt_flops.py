"""aerie's `ttt_flops_per_token` (crates/aerie-cli/src/cmd/bench/mod.rs) in Python, the one FLOP
count of the TTT baselines that are timed against `aerie bench`: scripts/bench_torch_ttt.py
(PyTorch eager) and scripts/gpu/specforge_ttt.py (SpecForge). Standard library only."""


def flops_per_token(s, l, k):
    """Matmul FLOPs per token of the TTT forward at sequence length `l` with `k` steps, for a
    drafter shape `s` (keys h, ht, aux, i, nh, nkv, d, vd): attention counted over the causal half
    plus the diagonal keys; backward costs about twice the forward."""
    h, d, i, nh, nkv = s["h"], s["d"], s["i"], s["nh"], s["nkv"]
    fc = 2.0 * s["aux"] * s["ht"] * h
    proj = 2.0 * 2.0 * h * (nh + 2 * nkv) * d + 2.0 * nh * d * h
    mlp = 3.0 * 2.0 * h * i
    head = 2.0 * h * s["vd"]
    attn = lambda step: 2.0 * 2.0 * nh * d * ((l + 1.0) / 2.0 + step)
    return fc + sum(proj + mlp + head + attn(j) for j in range(k))
