#!/usr/bin/env python3
"""The reference trainer's TTT step, timed on the same GPU and shape as `aerie bench train`.

Runs SpecForge 0.2.0's own EAGLE-3 training model (specforge.algorithms.eagle3.model's
OnlineEagle3Model around specforge.modeling.draft.llama3_eagle's LlamaForCausalLMEagle3, the
"sdpa" attention backend, which is SpecForge's default) at the AQ-MedAI Kimi-K2 drafter shape with
seeded random weights, and times forward + backward steps as aerie's bench does (warm-up steps,
then the median of the timed ones; no optimizer step). Prints one JSON object.

SpecForge is not installed: its wheel (fetched by scripts/gpu/fetch.sh into .work/gpu/) is unpacked
into a temporary folder that goes on sys.path. Nothing of it is copied into this repository.

    python3 scripts/gpu/specforge_ttt.py --wheel .work/gpu/specforge-0.2.0-py3-none-any.whl \
        --shape kimi --seq-len 2048 --steps 3 --warmup 1 --json

What is imported, and what is stubbed: scripts/specforge_wheel.py's docstring (the import
machinery is shared with scripts/specforge_finetune.py).
torch.compile: SpecForge compiles RMSNorm, RoPE and its teacher with torch.compile; that is kept
on CUDA (the compile happens in the warm-up steps) and disabled on the CPU (`--no-compile`
forces it off; `compile` in the JSON says which).

FLOPs per token: aerie's `ttt_flops_per_token` (crates/aerie-cli/src/cmd/bench.rs), the same
formula for both trainers:
  fwd = 2·3·Ht·H + Σ_{k<K} [ 2·2H·(nh + 2·nkv)·d + 2·nh·d·H + 3·2·H·I + 2·H·Vd
                             + 2·2·nh·d·((L+1)/2 + k) ],   fwd+bwd = 3 · fwd
(useful matmul FLOPs: attention over the causal half plus the K-1 diagonal keys; SpecForge's sdpa
path multiplies the full L×L score matrix, which this count does not credit).
MFU = flops_per_token · tokens/s / peak, peak = 989 TFLOP/s (H200 SXM, bf16 dense, no sparsity)
unless `--peak-tflops` says otherwise.

Timing: `median_step_seconds` is SpecForge's whole step (its forward builds the teacher from
the target logits: a softmax over the draft vocabulary plus a log-sum-exp over the full one).
aerie's bench builds its teacher before timing, so the step without the teacher,
`median_step_seconds_excl_teacher` (the step minus the median time of SpecForge's own
`_compute_target_p_padded` on the same inputs), is the one to compare; `tokens_per_second`
uses it, `tokens_per_second_incl_teacher` the whole step.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from ttt_flops import flops_per_token  # noqa: E402 - scripts/ttt_flops.py, aerie's ttt_flops_per_token
from specforge_wheel import DEFAULT_WHEEL, import_specforge, unpack  # noqa: E402 - scripts/specforge_wheel.py

# hidden, target hidden, aux layers, intermediate, heads, kv heads, head dim, vocab, draft vocab,
# rope theta, max positions, ttt length.
SHAPES = {
    "kimi": None,  # read from scripts/gpu/kimi-k2-drafter/config.json
    "tiny": dict(h=64, ht=64, aux=3, i=128, nh=4, nkv=2, d=16, v=512, vd=128, theta=10000.0,
                 max_pos=256, k=3),
}


def kimi_shape():
    c = json.loads((HERE / "kimi-k2-drafter" / "config.json").read_text())
    return dict(h=c["hidden_size"], ht=c["hidden_size"],
                aux=len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
                i=c["intermediate_size"], nh=c["num_attention_heads"], nkv=c["num_key_value_heads"],
                d=c["head_dim"], v=c["vocab_size"], vd=c["draft_vocab_size"], theta=c["rope_theta"],
                max_pos=c["max_position_embeddings"], k=7)


def build(llama, s, dtype, device, seed):
    import torch

    cfg = llama.LlamaConfig(
        hidden_size=s["h"], intermediate_size=s["i"], num_attention_heads=s["nh"],
        num_key_value_heads=s["nkv"], head_dim=s["d"], rms_norm_eps=1e-5, hidden_act="silu",
        rope_theta=s["theta"], max_position_embeddings=s["max_pos"], vocab_size=s["v"],
        draft_vocab_size=s["vd"], tie_word_embeddings=False, pretraining_tp=1, pad_token_id=None,
        num_hidden_layers=1,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        draft = llama.LlamaForCausalLMEagle3(cfg, attention_backend="sdpa")
    torch.manual_seed(seed)  # after construction: transformers' own init (if real) draws too
    with torch.no_grad():  # seeded random weights, N(0, 0.02) as transformers' Llama init
        for name, p in draft.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0)
        # The draft vocabulary: every (V / Vd)-th target id, as in aerie's bench.
        stride = s["v"] // s["vd"]
        ids = torch.arange(s["vd"], device=device) * stride
        draft.t2d.zero_()
        draft.t2d[ids] = True
        draft.d2t.copy_(ids - torch.arange(s["vd"], device=device))
    draft.freeze_embedding()  # as SpecForge's build_eagle3_draft: the target embedding is frozen
    draft = draft.to(device=device, dtype=dtype)
    return draft, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", default=str(DEFAULT_WHEEL))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="kimi")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ttt-length", type=int, default=0, help="0: the shape's (7 for kimi)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                    help="weights and activations (SpecForge trains in bf16)")
    ap.add_argument("--device", default="", help="default: cuda if available, else cpu")
    ap.add_argument("--no-compile", action="store_true", help="disable torch.compile (always off on the CPU)")
    ap.add_argument("--stub-transformers", action="store_true", help="stub transformers even if installed")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU (H200 bf16 dense: 989)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    use_cuda = device.type == "cuda"
    compile_on = use_cuda and not a.no_compile
    if not compile_on:
        import torch._dynamo
        torch._dynamo.config.disable = True
    if a.threads:
        torch.set_num_threads(a.threads)
    s = dict(SHAPES[a.shape] or kimi_shape())
    k = a.ttt_length or s["k"]
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    t_import = time.perf_counter()
    root = unpack(a.wheel)
    model_mod, llama, notes = import_specforge(root, use_cuda, a.stub_transformers)
    import_s = time.perf_counter() - t_import

    draft, draft_ids = build(llama, s, dtype, device, seed=0)
    ttt = model_mod.OnlineEagle3Model(draft, length=k, attention_backend="sdpa")
    trainable = sum(p.numel() for p in ttt.parameters() if p.requires_grad)
    b, l = a.batch, a.seq_len
    g = torch.Generator(device=device).manual_seed(1)
    hidden = torch.randn(b, l, s["aux"] * s["ht"], generator=g, device=device).to(dtype)
    input_ids = torch.randint(0, s["v"], (b, l), generator=g, device=device)
    attention_mask = torch.ones(b, l, dtype=torch.long, device=device)
    loss_mask = torch.ones(b, l, 1, dtype=torch.long, device=device)
    # Target logits over the full vocabulary: N(0, 2²) with the draft ids raised by 4, so the
    # target's argmax is (almost) always in the draft vocabulary, as aerie's bench has in_draft = 1.
    target = torch.randn(b, l, s["v"], generator=g, device=device) * 2.0
    target[..., draft_ids] += 4.0
    target = target.to(dtype)

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    def step():
        ttt.zero_grad(set_to_none=True)
        plosses, *_ = ttt(input_ids=input_ids, attention_mask=attention_mask, target=target,
                          loss_mask=loss_mask, hidden_states=hidden)
        loss = sum(0.8 ** i * p for i, p in enumerate(plosses))  # SpecForge's ploss_decay 0.8
        loss.backward()
        sync()
        return float(loss.detach())

    def teacher():
        with torch.no_grad():
            out = model_mod._compute_target_p_padded(target=target, t2d=draft.t2d, loss_mask=loss_mask, length=k)
        sync()
        return out

    times, losses, warm = [], [], []
    for it in range(a.warmup + a.steps):
        if use_cuda and it == a.warmup:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        losses.append(step())
        (times if it >= a.warmup else warm).append(time.perf_counter() - t0)
    peak_alloc = torch.cuda.max_memory_allocated(device) / 2**20 if use_cuda else None
    peak_reserved = torch.cuda.max_memory_reserved(device) / 2**20 if use_cuda else None
    teacher()  # warm (compiled on CUDA)
    tt = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        teacher()
        tt.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    med_teacher = sorted(tt)[len(tt) // 2]
    med_excl = max(med - med_teacher, 1e-12)
    fpt = 3.0 * flops_per_token(s, l, k)
    tps = b * l / med_excl
    rss = None
    try:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    except ImportError:
        pass
    report = dict(
        trainer="specforge 0.2.0 OnlineEagle3Model + LlamaForCausalLMEagle3 (sdpa)",
        torch=torch.__version__,
        device=torch.cuda.get_device_name(device) if use_cuda else "cpu",
        dtype=a.dtype,
        compile=compile_on,
        imports=notes,
        import_seconds=import_s,
        shape=a.shape,
        dims=s,
        seq_len=l,
        batch=b,
        ttt_length=k,
        trainable_params=trainable,
        embed_rows=s["v"],
        warmup_seconds=warm,
        step_seconds=times,
        median_step_seconds=med,
        teacher_seconds=tt,
        median_teacher_seconds=med_teacher,
        median_step_seconds_excl_teacher=med_excl,
        tokens_per_second=tps,
        tokens_per_second_incl_teacher=b * l / med,
        losses=losses,
        flops_per_token=fpt,
        flops_formula="3 x aerie ttt_flops_per_token (crates/aerie-cli/src/cmd/bench.rs)",
        achieved_tflops=fpt * tps / 1e12,
        peak_tflops=a.peak_tflops,
        mfu=fpt * tps / (a.peak_tflops * 1e12),
        peak_allocated_mib=peak_alloc,
        peak_reserved_mib=peak_reserved,
        peak_rss_mib=rss,
    )
    if not all(math.isfinite(x) for x in losses):
        report["error"] = "non-finite loss"
    if a.json:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=1))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
