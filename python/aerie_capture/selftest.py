"""The pre-flight self-test (`aerie capture --engine sglang|vllm --self-test`, or `python -m
aerie_capture --self-test`), for the GPU host before a long run. Two phases, each printing one
JSON line (`{"phase": ..., "ok": ...}`) and exiting non-zero when a check fails:

- `tiny`: a tiny random DeepSeek-V3 (MLA, routed + shared experts; Kimi-K2.5's text
  architecture) is written to a temp dir and captured by the transformers engine, whose aux rows
  must equal forward hooks on the decoder layers and whose final rows must equal the final norm's
  output, exactly. With `--engine sglang` the same model then goes through the SGLang engine on
  every rank, and rank 0 compares: aux and final rel error ≤ 2e-2 (bf16 on the GPU; SGLang fuses
  add+RMSNorm in f32) and top-1 agreement ≥ 95 %. With `--engine vllm` the same comparison runs
  against the vLLM engine (in this process; vLLM starts its own `--tp` workers).
- `real`: 8 samples of `--data` through the chosen engine on `--target`: the aux width is
  A·H and the final width H, every value is finite, the teacher's log-probs are ≤ 0 and
  descending, and the teacher's top-1 equals the next token on at least 30 % of the assistant
  (loss-mask) positions — a chat model on its own kind of data predicts well over that; rows
  shifted by one, a wrong head or a wrong vocabulary shard give far less.

The SGLang and vLLM phases run as two processes (`aerie capture` starts them one after the
other), since SGLang's distributed state is process-global and vLLM is run one engine per process.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

TINY_IDS = [[3, 17, 200, 5, 9], list(range(40, 57)), [(7 * i) % 500 for i in range(64)]]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _say(msg: str) -> None:
    print(f"self-test: {msg}", file=sys.stderr, flush=True)


def tiny_model(out: str, heads: int = 4, mla_kernel_shapes: bool = False) -> None:
    """`mla_kernel_shapes`: DeepSeek-V3's own latent width (kv_lora_rank 512 + rope 64 = 576),
    the only one vLLM's MLA kernels take (its CPU kernel compiles for 576 alone)."""
    import json

    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    mla = dict(kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32) if mla_kernel_shapes else dict(
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16
    )
    cfg = DeepseekV3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=6,
        first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        routed_scaling_factor=2.827, norm_topk_prob=True, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=32, max_position_embeddings=512, rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, **mla,
    )
    DeepseekV3ForCausalLM(cfg).save_pretrained(out)
    # transformers routes DeepSeek-V3 by sigmoid scores with a correction bias and does not
    # write it down; vLLM reads it from the config (as DeepSeek-V3's and Kimi's configs say).
    path = os.path.join(out, "config.json")
    with open(path) as f:
        c = json.load(f)
    c.update(topk_method="noaux_tc", scoring_func="sigmoid")
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def phase_tiny(a) -> dict:
    from .engines.hf import TransformersEngine

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    result: dict = {"phase": "tiny", "checks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        # Every rank writes the model itself (same seed, same weights): no collective is
        # available before SGLang sets up its process group.
        tiny_model(tmp, heads=max(4, world), mla_kernel_shapes=a.engine == "vllm")
        ok = True
        ref = None
        if rank == 0:
            dev = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
            hf = TransformersEngine(tmp, [1, 2, 3], final_hidden=True, topk=8, device=dev)
            seen = {}
            hooks = [
                layer.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, (o[0] if isinstance(o, tuple) else o).detach()))
                for k, layer in enumerate(hf.model.model.layers)
            ]
            ref = []
            worst_hook = worst_norm = 0.0
            for ids in TINY_IDS:
                (o,) = hf.capture([ids])
                want = torch.cat([seen[k][0] for k in (1, 2, 3)], -1)
                worst_hook = max(worst_hook, _rel(o.aux, want))
                with torch.no_grad():
                    worst_norm = max(worst_norm, _rel(o.final, hf.model.model.norm(seen[5])[0]))
                ref.append(o)
            for h in hooks:
                h.remove()
            result["checks"]["transformers_aux_vs_hooks_rel"] = worst_hook
            result["checks"]["transformers_final_vs_norm_rel"] = worst_norm
            ok &= worst_hook == 0.0 and worst_norm <= 1e-6
            _say(f"transformers engine on a tiny DeepSeek-V3 ({dev}): aux vs hooks {worst_hook:.1e}, final vs norm {worst_norm:.1e}")
        if a.engine == "sglang":
            from .engines.sglang import SGLangEngine

            eng = SGLangEngine(tmp, [1, 2, 3], True, 8, tp_size=world, attention_backend=a.attention_backend,
                               mem_fraction_static=min(a.mem_fraction_static, 0.3), max_batch_tokens=4096)
            outs = eng.capture(TINY_IDS)
            if rank == 0:
                aux = max(_rel(o.aux, r.aux) for o, r in zip(outs, ref))
                fin = max(_rel(o.final, r.final) for o, r in zip(outs, ref))
                top1 = torch.cat([(o.topk_ids[:, 0].cpu() == r.topk_ids[:, 0].cpu()).float() for o, r in zip(outs, ref)]).mean().item()
                result["checks"].update({"sglang_aux_rel": aux, "sglang_final_rel": fin, "sglang_top1_agreement": top1})
                ok &= aux <= 2e-2 and fin <= 2e-2 and top1 >= 0.95
                _say(f"sglang engine (tp{world}) vs transformers: aux rel {aux:.2e}, final rel {fin:.2e}, top-1 agreement {top1:.3f}")
            eng.shutdown()
        if a.engine == "vllm":
            from .engines.vllm import VllmEngine

            eng = VllmEngine(tmp, [1, 2, 3], True, 8, tp_size=a.tp, device=a.device, max_batch_tokens=4096,
                             gpu_memory_utilization=min(a.gpu_memory_utilization, 0.3), tmp_dir=a.vllm_tmp)
            outs = eng.capture(TINY_IDS)
            eng.shutdown()
            aux = max(_rel(o.aux, r.aux) for o, r in zip(outs, ref))
            fin = max(_rel(o.final, r.final) for o, r in zip(outs, ref))
            top1 = torch.cat([(o.topk_ids[:, 0].cpu() == r.topk_ids[:, 0].cpu()).float() for o, r in zip(outs, ref)]).mean().item()
            lp = max(float((o.topk_logprobs.cpu() - r.topk_logprobs.cpu()).abs().max()) for o, r in zip(outs, ref))
            result["checks"].update({"vllm_aux_rel": aux, "vllm_final_rel": fin, "vllm_top1_agreement": top1, "vllm_topk_logprob_abs": lp})
            ok &= aux <= 2e-2 and fin <= 2e-2 and top1 >= 0.95
            _say(f"vllm engine (tp{a.tp}) vs transformers: aux rel {aux:.2e}, final rel {fin:.2e}, top-1 agreement {top1:.3f}, top-k log-prob abs {lp:.2e}")
    result["ok"] = bool(ok)
    return result if rank == 0 else {}


def phase_real(a) -> dict:
    from .data import PreparedDataset
    from .engines import build_engine
    from .shards import Teacher
    from .contract import max_model_len, metadata_arg

    rank = int(os.environ.get("RANK", "0"))
    md = metadata_arg(a)
    data = PreparedDataset(a.data)
    max_model_len(a, data)
    engine = build_engine(a, md.aux_layer_ids, Teacher(True, 8))
    engine.check_metadata(md)
    samples = list(data.samples(a.split, limit=8))
    outs = engine.capture([s.input_ids for s in samples])
    engine.shutdown()
    if rank != 0:
        return {}
    h = engine.info.hidden_size
    width = len(engine.aux_layers) * h
    ok = True
    hits = total = 0
    norms = torch.zeros(len(engine.aux_layers))
    for s, o in zip(samples, outs):
        a_, f_ = o.aux.float().cpu(), o.final.float().cpu()
        ok &= tuple(a_.shape) == (len(s.input_ids), width) and tuple(f_.shape) == (len(s.input_ids), h)
        ok &= bool(torch.isfinite(a_).all()) and bool(torch.isfinite(f_).all())
        lp = o.topk_logprobs.float().cpu()
        ok &= bool((lp <= 1e-3).all()) and bool((lp[:, 1:] <= lp[:, :-1]).all())
        ids = torch.tensor(s.input_ids)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)[1:]
        pred = o.topk_ids[:-1, 0].cpu().long()
        hits += int(((pred == ids[1:]) & mask).sum())
        total += int(mask.sum())
        norms += a_.view(-1, len(engine.aux_layers), h).norm(dim=-1).mean(0)
    acc = hits / max(total, 1)
    ok &= total > 0 and acc >= 0.30
    norms = (norms / len(samples)).tolist()
    _say(f"{len(samples)} samples of {a.data}: aux width {width}, final width {h}, finite, teacher top-1 = next token on {acc:.1%} of {total} assistant positions; mean aux norm per layer {['%.1f' % n for n in norms]}")
    return {"phase": "real", "ok": bool(ok), "samples": len(samples), "aux_width": width, "hidden_size": h,
            "top1_next_token": acc, "assistant_positions": total, "aux_norm_per_layer": norms,
            "created_by_engine": engine.description}


def self_test(a) -> int:
    phases = ["tiny", "real"] if a.self_test == "all" else [a.self_test]
    failed = False
    for p in phases:
        if p == "real" and not (a.data and a.metadata):
            _say("no --data and --metadata (aerie passes both): the real-sample phase is skipped")
            continue
        r = phase_tiny(a) if p == "tiny" else phase_real(a)
        if r:
            print(json.dumps(r), flush=True)
            failed |= not r["ok"]
    return 1 if failed else 0
