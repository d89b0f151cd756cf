#!/usr/bin/env python3
"""Fine-tune an EAGLE-3 drafter on aerie shards with SpecForge 0.2.0's own training code: the
reference row of `aerie bench shift`.

    python3 scripts/specforge_finetune.py --wheel .work/gpu/specforge-0.2.0-py3-none-any.whl \\
        --warm-start RUN/checkpoint-N --target TARGET_DIR --shards SHARDS/train --out OUT \\
        --epochs 2 --lr 5e-4 --ttt-length 2 --seed 0 --json

Writes OUT/config.json (the warm start's), OUT/model.safetensors (the SGLang layout: the warm
start's keys and dtypes, d2t/t2d copied) and OUT/specforge.json (steps, tokens, seconds, losses,
versions, the wheel's sha256), all at once (built in OUT.tmp-PID, renamed into place). aerie scores
OUT like any drafter (`aerie eval accept --drafter OUT ...`).

What is SpecForge's (imported from the wheel, scripts/specforge_wheel.py; nothing re-implemented):
- the drafter: specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3 ("sdpa" backend,
  SpecForge's default), its embedding from the target by its own `load_embedding` and frozen by
  `freeze_embedding`, as SpecForge's build_eagle3_draft does;
- the sample: specforge.algorithms.eagle3.data.normalize_offline_sample (SpecForge's offline
  normaliser: the names, attention mask, loss_mask[-1] = 0);
- the step: specforge.training.controller.TrainerCore.train_step around
  specforge.training.strategies.base.Eagle3TrainStrategy.forward_loss (the frozen
  specforge.modeling.target.target_head.TargetHead's shift `preprocess` and projection, then
  specforge.algorithms.eagle3.model.OnlineEagle3Model: its teacher `_compute_target_p_padded`
  restricted by t2d, its TTT unroll and its per-step loss, weighted 0.8^k by the strategy);
- the loss kernel: SpecForge's reference `core.loss._compute_loss` (its triton LogSoftmaxLoss
  needs CUDA; same value);
- the optimizer: specforge.optimizer.BF16Optimizer (torch AdamW on fp32 master weights, betas
  (0.9, 0.999), eps 1e-8, weight decay 0, the global-norm clip at --max-grad-norm, then the
  scheduler) with SpecForge's specforge.lr_scheduler.CosineAnnealingWarmupLR ("cosine", its
  default): warm-up (s+1)/W·lr over W = int(warmup_ratio · total) steps, then cosine to 0 over
  the rest (aerie: W = ceil(...), same shape otherwise).

Glue (this file): reading the shards (aerie_capture.shards, one sample per step, the teacher
from the stored final hidden state); the sample order, SpecForge's DistributedSampler order
(torch.randperm with a generator seeded seed + epoch, repeated from
specforge.launch._distributed_sampler_indices, whose module imports the whole runtime); loading
the warm start's SGLang keys into the model (the identity map, as SpecForge's own exporter
`export/to_sglang.py` WEIGHT_MAPS says for LlamaForCausalLMEagle3; every key must be consumed and
every parameter but the target's embedding filled); the target head's weight (TargetHead's own
loader wants a `*.index.json` and an `lm_head.weight` key; SmolLM2 has one file and tied
embeddings, so its `model.embed_tokens.weight` is copied into TargetHead.fc); a one-process
TrainingBackend (backward, then the optimizer's step); the export.

Precision (`--dtype`): f32 (default) is the recipe's `precision = "f32"`: drafter, target head and
features in float32, as aerie trains. bf16 is SpecForge's default (`model.torch_dtype`,
TargetHead in bf16): bf16 weights and activations, fp32 masters in BF16Optimizer; the masters
start from the f32 warm start (SpecForge would clone them from the bf16-rounded weights; starting
from the warm start itself makes a 0-step export the warm start) and are what is exported, in the
warm start's float32.

`--eval-only N` trains nothing: it prints SpecForge's loss (forward_loss, no gradient) on the
first N samples of --shards and their position-weighted mean, which is the number
`aerie eval loss` reports for the same samples (both normalise by all token positions).
"""

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from specforge_wheel import DEFAULT_WHEEL, import_specforge, import_training, sha256, unpack  # noqa: E402

try:
    import aerie_capture.shards  # noqa: F401
except ImportError:  # a source checkout: aerie's Python packages are in python/
    sys.path.insert(0, str(HERE.parent / "python"))
from aerie_capture.shards import ShardDataset  # noqa: E402

VOCAB_BUFFERS = ("d2t", "t2d")
EMBED_KEY = "embed_tokens.weight"


class Loaded:
    """SpecForge's modules, imported once per process."""

    _cache = {}

    @classmethod
    def get(cls, wheel):
        wheel = str(Path(wheel).resolve())
        if wheel not in cls._cache:
            import torch._dynamo
            torch._dynamo.config.disable = True  # SpecForge's torch.compile decorators: eager on the CPU
            root = unpack(wheel)
            model, llama, notes = import_specforge(root, use_cuda=False, stub_tf=False)
            if notes["transformers"] == "stub":
                raise SystemExit("specforge_finetune: needs transformers (TargetHead reads the target's config)")
            cls._cache[wheel] = (model, llama, import_training(), notes)
        return cls._cache[wheel]


def sglang_to_specforge(key):
    """The SGLang key's name in SpecForge's LlamaForCausalLMEagle3: the identity (SpecForge's
    export/to_sglang.py WEIGHT_MAPS["LlamaForCausalLMEagle3"] = {})."""
    return key


def specforge_config(cfg_json, where):
    """The warm start's config as SpecForge's LlamaForCausalLMEagle3 reads it. One key means
    different things: aerie's (and EAGLE-3.1's) `norm_output` = the next draft step consumes the
    post-norm state (false: plain EAGLE-3), SpecForge's = apply the final norm before lm_head
    (absent: true). Plain EAGLE-3 is SpecForge's `norm_output` true; aerie's true (EAGLE-3.1) has
    no SpecForge counterpart and is refused, as is vLLM's `norm_before_residual` (SpecForge's
    layer keeps the residual before `hidden_norm`)."""
    c = dict(cfg_json)
    if c.get("norm_output", False):
        raise SystemExit(f"{where}: norm_output = true (EAGLE-3.1): SpecForge 0.2.0's Llama drafter has no such variant")
    if c.get("norm_before_residual", False):
        raise SystemExit(f"{where}: norm_before_residual = true: SpecForge 0.2.0's Llama drafter has no such variant")
    c["norm_output"] = True
    return c


def build_draft(llama, warm_dir, target_dir, dtype):
    """SpecForge's drafter holding the warm start's weights and the target's frozen embedding;
    returns (draft, warm tensors, warm config, warm metadata)."""
    import torch
    from safetensors import safe_open

    warm_dir = Path(warm_dir)
    cfg_json = json.loads((warm_dir / "config.json").read_text())
    arch = cfg_json.get("architectures") or []
    if arch != ["LlamaForCausalLMEagle3"]:
        raise SystemExit(f"{warm_dir}/config.json: architectures {arch}, this path trains LlamaForCausalLMEagle3")
    cfg = llama.LlamaConfig(**specforge_config(cfg_json, warm_dir))
    draft = llama.LlamaForCausalLMEagle3(cfg, attention_backend="sdpa")
    with safe_open(warm_dir / "model.safetensors", framework="pt") as f:
        meta = f.metadata() or {}
        warm = {k: f.get_tensor(k) for k in f.keys()}
    state = draft.state_dict()
    params = {n for n, _ in draft.named_parameters()}
    unknown = [k for k in warm if sglang_to_specforge(k) not in state]
    if unknown:
        raise SystemExit(f"{warm_dir}: keys SpecForge's LlamaForCausalLMEagle3 has no place for: {unknown}")
    filled = {sglang_to_specforge(k) for k in warm}
    missing = sorted((params | set(VOCAB_BUFFERS)) - filled - {EMBED_KEY})
    if missing:
        raise SystemExit(f"{warm_dir}: the warm start lacks {missing}")
    with torch.no_grad():
        for k, t in warm.items():
            dst = state[sglang_to_specforge(k)]
            if tuple(dst.shape) != tuple(t.shape):
                raise SystemExit(f"{warm_dir}: {k}: shape {list(t.shape)}, the model's is {list(dst.shape)}")
            dst.copy_(t)
    draft.load_embedding(str(target_dir), embedding_key="model.embed_tokens.weight")  # SpecForge's
    draft.freeze_embedding()  # SpecForge's, as build_eagle3_draft
    draft = draft.to(dtype=dtype)
    for k in VOCAB_BUFFERS:  # integer/bool buffers keep their dtype through .to(dtype)
        if not torch.equal(getattr(draft, k), warm[k]):
            raise SystemExit(f"{warm_dir}: {k} did not load")
    return draft, warm, cfg_json, meta


def build_target_head(th_mod, target_dir, dtype):
    """SpecForge's TargetHead with the target's lm_head (its tied embedding when it has none)."""
    import torch
    from safetensors import safe_open

    head = th_mod.TargetHead(str(target_dir))
    files = sorted(Path(target_dir).glob("*.safetensors"))
    weight = None
    for key in ("lm_head.weight", "model.embed_tokens.weight"):
        for p in files:
            with safe_open(p, framework="pt") as f:
                if key in f.keys():
                    weight = f.get_tensor(key)
                    break
        if weight is not None:
            break
    if weight is None:
        raise SystemExit(f"{target_dir}: no lm_head.weight nor model.embed_tokens.weight")
    with torch.no_grad():
        head.fc.weight.copy_(weight)
    head.freeze_weights()
    return head.eval().to(dtype=dtype)


def sampler_order(n, seed, epoch):
    """specforge.launch._distributed_sampler_indices(n, dp_rank=0, dp_size=1, seed, epoch): one
    replica's DistributedSampler(shuffle=True) order."""
    import torch

    g = torch.Generator()
    g.manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=g).tolist()


def read_samples(shards):
    ds = ShardDataset(shards)
    if not ds.metadata.teacher.final_hidden:
        raise SystemExit(f"{shards}: the teacher is `{ds.metadata.teacher}`; this path needs final-hidden")
    import torch
    out = []
    for s in ds.samples():  # hidden states as bf16 when stored so (exact), else f32
        keep = torch.bfloat16 if ds.metadata.encoding.name == "bf16" else torch.float32
        out.append((s.input_ids.long(), s.loss_mask.long(), s.aux_hidden.to(keep), s.final_hidden.to(keep)))
    return ds, out


def make_batch(sf, sample, index, dtype, max_len):
    """One sample as SpecForge's offline TrainBatch (its normaliser; batch of one: no padding)."""
    from specforge.runtime.contracts import TrainBatch

    ids, mask, aux, fin = sample
    raw = {"input_ids": ids, "loss_mask": mask, "aux_hidden_state": aux.to(dtype)[None],
           "hidden_state": fin.to(dtype)[None]}
    t = sf.data.normalize_offline_sample(raw, max_len)
    return TrainBatch(sample_ids=[str(index)], strategy="eagle3", tensors=t, metadata={"target_repr": "hidden_state"})


def export(out, warm_dir, warm, meta, masters, report):
    """OUT/{config.json, model.safetensors, specforge.json}, written in OUT.tmp-PID and renamed."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    tensors = {}
    for k, t in warm.items():
        if k in VOCAB_BUFFERS:
            tensors[k] = t.clone()
        else:
            tensors[k] = masters[sglang_to_specforge(k)].detach().to(device="cpu", dtype=t.dtype).contiguous()
    unused = set(masters) - {sglang_to_specforge(k) for k in warm}
    if unused:
        raise SystemExit(f"trained tensors with no key in the warm start: {sorted(unused)}")
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata=meta)
    shutil.copyfile(Path(warm_dir) / "config.json", tmp / "config.json")  # the warm start's, byte for byte
    (tmp / "specforge.json").write_text(json.dumps(report, indent=1) + "\n")
    for p in tmp.iterdir():
        os.chmod(p, 0o644)
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    old = None
    if out.exists():
        old = out.parent / f"{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old)
    del torch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", default=str(DEFAULT_WHEEL))
    ap.add_argument("--warm-start", required=True, help="drafter directory, SGLang layout")
    ap.add_argument("--target", required=True, help="target model directory (embedding, lm_head)")
    ap.add_argument("--shards", required=True, help="aerie shard directory with a final-hidden teacher")
    ap.add_argument("--out", help="drafter directory to write (required unless --eval-only)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps (the schedule keeps its length)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup-ratio", type=float, default=0.05)
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--ttt-length", type=int, default=2)
    ap.add_argument("--step-decay", type=float, default=0.8, help="SpecForge's ploss_decay")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-only", type=int, default=0, metavar="N", help="print the loss on the first N samples; no training")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (else indented)")
    a = ap.parse_args(argv)
    if not a.eval_only and not a.out:
        ap.error("--out is required unless --eval-only")

    t_start = time.perf_counter()
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    model_mod, llama, sf, notes = Loaded.get(a.wheel)

    draft, warm, cfg_json, meta = build_draft(llama, a.warm_start, a.target, dtype)
    ttt = model_mod.OnlineEagle3Model(draft, length=a.ttt_length, attention_backend="sdpa")
    head = build_target_head(sf.target_head, a.target, dtype)
    strategy = sf.strategies.Eagle3TrainStrategy(ttt, target_head=head, ploss_decay=a.step_decay)
    ds, samples = read_samples(a.shards)
    max_len = max(len(s[0]) for s in samples)

    if a.eval_only:
        rows = []
        with torch.no_grad():
            for i, s in enumerate(samples[: a.eval_only]):
                out = strategy.forward_loss(make_batch(sf, s, i, dtype, max_len))
                rows.append(dict(sample=i, tokens=len(s[0]), loss=float(out.loss),
                                 loss_per_step=[float(p) for p in out.metrics["plosses"]]))
        pos = sum(r["tokens"] for r in rows)
        report = dict(samples=rows, positions=pos, loss=sum(r["loss"] * r["tokens"] for r in rows) / pos,
                      loss_per_step=[sum(r["loss_per_step"][k] * r["tokens"] for r in rows) / pos for k in range(a.ttt_length)],
                      dtype=a.dtype, ttt_length=a.ttt_length, imports=notes)
        print(json.dumps(report) if a.json else json.dumps(report, indent=1))
        return 0

    epochs_plan = [sampler_order(len(samples), a.seed, e) for e in range(a.epochs)]
    total = sum(len(o) for o in epochs_plan)
    opt = sf.optimizer.BF16Optimizer(ttt, lr=a.lr, weight_decay=0.0, max_grad_norm=a.max_grad_norm,
                                     total_steps=total, warmup_ratio=a.warmup_ratio, lr_scheduler="cosine")
    names = [n for n, p in ttt.named_parameters() if p.requires_grad]
    if len(names) != len(opt.fp32_params):
        raise SystemExit("BF16Optimizer's parameters are not the model's trainable ones")
    masters = {n.removeprefix("draft_model."): mp for n, mp in zip(names, opt.fp32_params)}
    with torch.no_grad():  # the masters start from the warm start itself (f32: the same values)
        for k, mp in masters.items():
            if k in warm:
                mp.copy_(warm[k].to(torch.float32))

    class OneProcess(sf.backend.TrainingBackend):
        name = "one-process"

        def prepare_model(self, model):
            return model

        def backward(self, loss, *, is_boundary=True):
            loss.backward()

        def step(self):
            return opt.step()

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            raise NotImplementedError

    core = sf.controller.TrainerCore(strategy, OneProcess(), accumulation_steps=1)
    ttt.train()
    steps, tokens, masked, log = 0, 0, 0, []
    losses, norms = [], []
    t_train = time.perf_counter()
    stop = False
    for epoch, order in enumerate(epochs_plan):
        for i in order:
            if a.max_steps is not None and steps >= a.max_steps:
                stop = True
                break
            lr = opt.get_learning_rate()
            res = core.train_step(make_batch(sf, samples[i], i, dtype, max_len))
            if not res.optimizer_stepped:
                raise SystemExit("TrainerCore did not step")
            if not math.isfinite(res.loss):
                raise SystemExit(f"non-finite loss at step {steps}")
            steps += 1
            tokens += len(samples[i][0])
            masked += int(samples[i][1].sum())
            losses.append(res.loss)
            norms.append(res.grad_norm)
            if steps % a.log_every == 0 or steps == total:
                recent = losses[-a.log_every:]
                line = dict(step=steps, epoch=epoch, loss=sum(recent) / len(recent), lr=lr,
                            grad_norm=res.grad_norm, elapsed_s=time.perf_counter() - t_train)
                log.append(line)
                print(json.dumps(line), file=sys.stderr, flush=True)
        if stop:
            break
    train_s = time.perf_counter() - t_train
    report = dict(
        trainer="specforge 0.2.0: TrainerCore + Eagle3TrainStrategy + OnlineEagle3Model(LlamaForCausalLMEagle3, sdpa) + BF16Optimizer(cosine)",
        warm_start=str(a.warm_start), target=str(a.target), shards=str(a.shards),
        steps=steps, total_steps_planned=total, epochs=a.epochs, samples=len(samples), tokens=tokens,
        masked_tokens=masked, seconds=time.perf_counter() - t_start, train_seconds=train_s,
        final_loss=losses[-1] if losses else None,
        final_loss_mean_last_10=(sum(losses[-10:]) / len(losses[-10:])) if losses else None,
        losses=losses, grad_norms=norms, log=log,
        recipe=dict(lr=a.lr, warmup_ratio=a.warmup_ratio, warmup_steps=int(a.warmup_ratio * total),
                    max_grad_norm=a.max_grad_norm, ttt_length=a.ttt_length, step_decay=a.step_decay,
                    seed=a.seed, dtype=a.dtype, optimizer="torch AdamW (betas 0.9/0.999, eps 1e-8, wd 0) in specforge BF16Optimizer",
                    scheduler="specforge CosineAnnealingWarmupLR", batch="one sample per step"),
        versions=dict(specforge="0.2.0", torch=torch.__version__, transformers=transformers.__version__,
                      python=platform.python_version()),
        wheel=str(a.wheel), wheel_sha256=sha256(a.wheel), imports=notes, threads=a.threads,
    )
    export(a.out, a.warm_start, warm, meta, masters, report)
    brief = {k: v for k, v in report.items() if k not in ("losses", "grad_norms", "log")}
    print(json.dumps(brief) if a.json else json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
