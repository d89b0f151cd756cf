"""SpecForge 0.2.0's own code, imported from its wheel without installing it: the machinery that
scripts/gpu/specforge_ttt.py (its TTT step, timed) and scripts/specforge_finetune.py (a
fine-tune with its training step, scored by aerie) share.

The wheel (fetched by scripts/gpu/fetch.sh into .work/gpu/) is unpacked into a temporary folder
that goes on sys.path (`unpack`); nothing of it is copied into this repository.
`import_specforge` imports the EAGLE-3 TTT path (the draft model and the training model);
`import_training` adds the pieces of SpecForge's training loop that the fine-tune uses.

What is imported, and what is stubbed (only where the module is missing; `imports` in the JSON
says which):
- The package `__init__`s of specforge.modeling.draft and specforge.algorithms(.eagle3) are not
  run: they import every draft architecture (DFlash/Qwen3, Domino, DSpark, P-EAGLE) and the
  training registry, none of which this path uses. The modules this path needs are imported
  under empty package objects instead.
- transformers (SpecForge 0.2.0 pins 5.8.1): if it is missing, or `--stub-transformers`, a
  stub gives the few names these modules import: ACT2FN["silu"], Cache/DynamicCache (unused
  with the sdpa backend), LlamaConfig (an attribute bag), PreTrainedModel (a plain nn.Module; the
  weights are initialised by this script either way), is_torchdynamo_compiling, AutoTokenizer,
  PreTrainedTokenizerFast and cached_file (imported by specforge.utils, unused here).
- huggingface_hub.snapshot_download and safetensors.safe_open (imported by the draft base class
  for loading checkpoints, unused here): stubbed if missing.
- triton (SpecForge's fused LogSoftmaxLoss): on a machine without CUDA or without triton, a stub
  lets core/loss.py import, and the loss is SpecForge's own reference `_compute_loss` from the
  same file (same value: -mean over B·T of sum(mask · p · log_softmax)). `loss_impl` says which.
- sglang, yunchang, flash_attn: not imported on this path (flash_attn is optional in
  llama3_eagle.py and yunchang is only imported by the USP backend).
"""

import hashlib
import importlib
import sys
import tempfile
import types
import zipfile
from pathlib import Path

DEFAULT_WHEEL = Path(__file__).resolve().parent.parent / ".work/gpu/specforge-0.2.0-py3-none-any.whl"


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__stub__ = True
    sys.modules[name] = m
    return m


def stub_transformers():
    import torch.nn as nn

    class LlamaConfig:  # an attribute bag with the defaults llama3_eagle.py reads
        def __init__(self, **kw):
            self.pretraining_tp = 1
            self.pad_token_id = None
            self.rope_scaling = None
            self.rope_theta = 10000.0
            self.__dict__.update(kw)

    class PreTrainedModel(nn.Module):  # weights are initialised by this script
        config_class = None

        def __init__(self, config, *args, **kwargs):
            super().__init__()
            self.config = config

        def post_init(self):
            pass

    class Cache:  # only the flex_attention backend uses a cache
        pass

    class DynamicCache(Cache):
        pass

    def unused(*a, **k):
        raise RuntimeError("stubbed transformers: not used on the TTT path")

    act = {"silu": nn.SiLU()}
    tokenizer = type("Unused", (), {"from_pretrained": staticmethod(unused)})
    _module("transformers", __path__=[], DynamicCache=DynamicCache, AutoTokenizer=tokenizer,
            PreTrainedTokenizerFast=tokenizer, PreTrainedModel=PreTrainedModel)
    _module("transformers.activations", ACT2FN=act)
    _module("transformers.cache_utils", Cache=Cache, DynamicCache=DynamicCache)
    _module("transformers.modeling_utils", PreTrainedModel=PreTrainedModel)
    _module("transformers.utils", __path__=[], is_torchdynamo_compiling=lambda: False, cached_file=unused)
    _module("transformers.models", __path__=[])
    _module("transformers.models.llama", __path__=[])
    _module("transformers.models.llama.configuration_llama", LlamaConfig=LlamaConfig)


def stub_triton():
    """Lets core/loss.py import; its triton kernels are never launched (see loss_impl). Put in
    sys.modules only while SpecForge's loss module imports, after torch has looked for the real
    triton itself (torch's inductor would otherwise take the stub for triton)."""
    try:
        import torch._inductor.runtime.triton_compat  # noqa: F401
    except Exception:  # noqa: BLE001 - only ordering matters here
        pass

    class _Lang(types.ModuleType):
        constexpr = int

        def __getattr__(self, name):
            return None

    saved = {n: sys.modules.get(n) for n in ("triton", "triton.language")}
    lang = _Lang("triton.language")
    lang.__stub__ = True
    sys.modules["triton.language"] = lang
    _module("triton", __path__=[], jit=lambda fn=None, **k: fn if fn is not None else (lambda f: f),
            language=lang, next_power_of_2=lambda n: 1 << max(0, int(n - 1).bit_length()))

    def restore():
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return restore


def have(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def unpack(wheel):
    """The wheel's files in a temporary folder (kept for the process: tracebacks show sources)."""
    dest = Path(tempfile.mkdtemp(prefix="specforge-wheel-"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)
    return dest


def import_specforge(root, use_cuda, stub_tf):
    """SpecForge's modules for the EAGLE-3 TTT path; returns (model module, draft module, notes)."""
    notes = {}
    sys.path.insert(0, str(root))
    if stub_tf or not have("transformers"):
        stub_transformers()
        notes["transformers"] = "stub"
    else:
        import transformers
        notes["transformers"] = f"real {transformers.__version__}"
    for mod, attrs in (("huggingface_hub", {"snapshot_download": None}), ("safetensors", {"safe_open": None})):
        if have(mod):
            notes[mod] = "real"
        else:
            _module(mod, **attrs)
            notes[mod] = "stub"
    triton_ok = use_cuda and have("triton")
    if triton_ok:
        import triton
        notes["triton"] = f"real {triton.__version__}"
    else:
        notes["triton"] = "real, unused (no CUDA)" if have("triton") else "stub"
    # Package objects without their __init__ (they import every draft architecture and the
    # training registry, which this path does not use).
    for pkg in ("specforge.modeling.draft", "specforge.algorithms", "specforge.algorithms.eagle3"):
        importlib.import_module(pkg.rsplit(".", 1)[0])
        m = types.ModuleType(pkg)
        m.__path__ = [str(root / pkg.replace(".", "/"))]
        sys.modules[pkg] = m
    draft_pkg = sys.modules["specforge.modeling.draft"]
    base = importlib.import_module("specforge.modeling.draft.base")
    draft_pkg.Eagle3DraftModel = base.Eagle3DraftModel
    llama = importlib.import_module("specforge.modeling.draft.llama3_eagle")
    draft_pkg.LlamaForCausalLMEagle3 = llama.LlamaForCausalLMEagle3
    restore = stub_triton() if notes["triton"] == "stub" else None
    try:
        importlib.import_module("specforge.core.loss")
    finally:
        if restore:
            restore()
    model = importlib.import_module("specforge.algorithms.eagle3.model")
    if triton_ok:
        notes["loss_impl"] = "specforge LogSoftmaxLoss (triton)"
    else:
        # SpecForge's own reference implementation in the same file, same value.
        ref = importlib.import_module("specforge.core.loss")._compute_loss
        model.LogSoftmaxLoss = types.SimpleNamespace(apply=ref)
        notes["loss_impl"] = "specforge core.loss._compute_loss (reference; no triton/CUDA)"
    return model, llama, notes


def import_training():
    """After `import_specforge`: the modules of SpecForge's training loop the fine-tune runs
    (every one SpecForge's own, imported from the wheel):
    - specforge.training.strategies.base: Eagle3TrainStrategy (forward_loss: the target head's
      shift and projection, OnlineEagle3Model, the 0.8^k step weights);
    - specforge.training.controller: TrainerCore (train_step: forward_loss, backward, optimizer
      step at the accumulation boundary) and specforge.training.backend.TrainingBackend;
    - specforge.modeling.target.target_head: TargetHead (the frozen lm_head);
    - specforge.algorithms.eagle3.data: normalize_offline_sample (the offline sample's tensors);
    - specforge.optimizer: BF16Optimizer (AdamW on fp32 masters, global-norm clip, scheduler);
    - specforge.launch._distributed_sampler_indices is NOT imported (specforge.launch pulls the
      whole runtime); the fine-tune repeats its three lines (see there).
    Returns a namespace of modules."""
    names = dict(
        strategies="specforge.training.strategies.base",
        controller="specforge.training.controller",
        backend="specforge.training.backend",
        target_head="specforge.modeling.target.target_head",
        data="specforge.algorithms.eagle3.data",
        optimizer="specforge.optimizer",
        lr_scheduler="specforge.lr_scheduler",
    )
    return types.SimpleNamespace(**{k: importlib.import_module(v) for k, v in names.items()})


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
