"""The SGLang engine: every tensor-parallel rank (one process per GPU, under `torchrun`) runs
SGLang's own `ModelRunner` in process — no scheduler, no HTTP, no tokenizer manager — on packed,
unpadded prefill batches with the radix cache, chunked prefill and CUDA graphs off. The bootstrap
is SGLang 0.5.23's own in-tree sequence (`sglang.benchmark.one_batch`: `publish`, the parallel
and layer runtimes, `ModelRunner`, its memory pool and attention backends). The aux states come
from SGLang's EAGLE-3 capture (`set_eagle3_layers_to_capture`, then `layers_to_capture` set
explicitly, forward with `CaptureHiddenMode.FULL`), the post-norm final state from what the
model hands its logits processor (every position: the states SGLang's head reads), and the exact
top-k teacher from the vocabulary-sharded head (teacher.py). Only rank 0 copies to the host and
writes.

**Status:** run for real at tp 1 on the CPU (`device="cpu"`: SGLang's CPU engine,
`SGLANG_USE_CPU_ENGINE=1`, the `torch_native` attention backend, which serves prefill; PyPI has no
CPU `sgl_kernel`, so the tests put their stand-in on the path through
`AERIE_SGLANG_TEST_KERNELS`): the SmolLM2 capture equals the transformers engine in f32
(crates/aerie-cli/tests/sglang_capture.rs). On GPUs and at tp > 1 it is the same code with
`device="cuda"`, not run here. `check_api()` asserts every SGLang name and parameter the engine
relies on, so a different SGLang version fails loudly before a model is loaded; the self-test
(`aerie capture --engine sglang --self-test`) then compares the engine with the transformers
engine on a tiny random DeepSeek-V3 before a long run.

The module top holds the pure functions (no SGLang import), tested on the CPU: SGLang's
layer-numbering rule per model class, the explicit `layers_to_capture` aerie sets, splitting
packed rows per sample, and the vocab shard layout of the head.
"""

from __future__ import annotations

import inspect
import os
from typing import Optional

import torch

from . import CaptureOutput, Engine, SeamCheck, TargetInfo
from ..teacher import merge_topk, shard_topk

SGLANG_VERSION = "0.5.23"

# Model classes whose `set_eagle3_layers_to_capture` follows the DeepSeek rule (models/
# deepseek_v2.py; Kimi-K2.5 delegates to its DeepseekV3 `language_model`, models/kimi_k25.py).
DEEPSEEK_FAMILY = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration"}
)
# Wrappers whose text model (the module with `.model.layers_to_capture` and `.lm_head`) is
# `self.language_model`.
WRAPPED = frozenset({"KimiK25ForConditionalGeneration"})


def sglang_eagle3_rule(arch: str, ids: Optional[list[int]], num_layers: int) -> list[int]:
    """What SGLang's `set_eagle3_layers_to_capture(ids)` sets `layers_to_capture` to, per model
    class (SGLang counts input-of-layer: the residual stream entering layer j):
    DeepSeek/Kimi add 1 only when the first id is 1 (read as output-of-layer ids), otherwise use
    the ids as given; Llama/Qwen and the rest always add 1; no ids mean `[2, L//2, L-3]`."""
    if ids is None:
        return [2, num_layers // 2, num_layers - 3]
    if arch in DEEPSEEK_FAMILY:
        return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)
    return [i + 1 for i in ids]


def layers_to_capture(ids: list[int], num_layers: int) -> list[int]:
    """The input-of-layer indices that capture aerie's output-of-layer `ids`: output of layer i
    = input of layer i+1 (= HF `hidden_states[i+1]`). The last layer has no next layer: aerie
    never asks for its output (crates/aerie-capture/src/contract.rs), and SGLang's capture would
    not hold it (the engine checks the captured width)."""
    return [i + 1 for i in ids]


def split_packed(rows: torch.Tensor, lens: list[int]) -> list[torch.Tensor]:
    """Split a packed [ΣT, W] batch into one [T_i, W] view per sample, in order."""
    if any(n <= 0 for n in lens):
        raise ValueError(f"empty sample in a packed batch: lengths {lens}")
    if rows.shape[0] != sum(lens):
        raise ValueError(f"packed batch has {rows.shape[0]} rows for samples of {sum(lens)} tokens ({lens})")
    return list(rows.split(lens))


def vocab_shard(vocab: int, tp_size: int, rank: int, padding: int = 64) -> tuple[int, int]:
    """Global id range `[start, end)` of rank's head rows under SGLang's `ParallelLMHead`: the
    vocabulary padded to a multiple of `padding` (DEFAULT_VOCAB_PADDING_SIZE), then split into
    equal parts; ids ≥ vocab in a shard are padding (masked by `shard_topk`). The engine reads
    the shard size from the weight itself and uses this only to check it."""
    padded = -(-vocab // padding) * padding
    if padded % tp_size:
        raise ValueError(f"padded vocabulary {padded} does not split over {tp_size} ranks")
    per = padded // tp_size
    return rank * per, (rank + 1) * per


def check_api() -> list[str]:
    """Every SGLang seam the engine uses, checked against the installed SGLang without loading a
    model. Returns the problems (empty when the installed SGLang is the one this engine is
    written for and has every name and parameter)."""
    check = SeamCheck()
    if check.installed("sglang", SGLANG_VERSION, f"install sglang=={SGLANG_VERSION} (pip install './python[sglang]')") is None:
        return check.problems
    problems = check.problems

    def need(modname: str, attr: str, params: tuple[str, ...] = ()):
        obj = check.need(modname, attr)
        if obj is None:
            return None
        if params:
            fn = obj.__init__ if inspect.isclass(obj) else obj
            have = set(inspect.signature(fn).parameters)
            # msgspec structs (ServerArgs, SamplingParams in 0.5.23) take their fields as keywords.
            have |= set(getattr(obj, "__struct_fields__", ()))
            missing = [p for p in params if p not in have]
            if missing:
                problems.append(f"{modname}.{attr}: no parameter {', '.join(missing)} (has {', '.join(sorted(have))})")
        return obj

    sa = need(
        "sglang.srt.server_args",
        "ServerArgs",
        ("model_path", "tp_size", "device", "dtype", "disable_radix_cache", "chunked_prefill_size", "disable_cuda_graph",
         "skip_tokenizer_init", "attention_backend", "mem_fraction_static", "max_total_tokens", "max_running_requests"),
    )
    if sa is not None and not hasattr(sa, "resolve_once"):
        problems.append("ServerArgs.resolve_once: missing")
    need("sglang.srt.server_args", "PortArgs")
    need("sglang.srt.configs.model_config", "ModelConfig")
    need("sglang.srt.model_executor.model_runner", "ModelRunner", ("model_config", "mem_fraction_static", "gpu_id", "nccl_port", "server_args"))
    boot = need("sglang.srt.distributed", "bootstrap")
    for fn in ("init_parallel_runtime", "init_layer_runtime"):
        if boot is not None and not hasattr(boot, fn):
            problems.append(f"sglang.srt.distributed.bootstrap.{fn}: missing")
    for name in ("publish", "SpawnRanks", "spawn_world_rank", "get_device", "get_schedule"):
        need("sglang.srt.runtime_context", name)
    need("sglang.srt.entrypoints.engine", "_set_envs_and_config")
    for name in ("initialize_moe_config",):
        need("sglang.srt.layers.moe", name)
    need("sglang.srt.layers.quantization.fp8_utils", "initialize_fp8_gemm_config")
    need("sglang.srt.layers.quantization.unquant", "initialize_bf16_gemm_config")
    need("sglang.srt.layers.quantization.fp4_utils", "initialize_fp4_gemm_config")
    need("sglang.srt.managers.schedule_batch", "Req", ("rid", "origin_input_text", "origin_input_ids", "sampling_params"))
    sb = need("sglang.srt.managers.schedule_batch", "ScheduleBatch")
    if sb is not None:
        for m in ("init_new", "prepare_for_extend"):
            if not hasattr(sb, m):
                problems.append(f"ScheduleBatch.{m}: missing")
    need("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm")
    fb = need("sglang.srt.model_executor.forward_batch_info", "ForwardBatch")
    if fb is not None and not hasattr(fb, "init_new"):
        problems.append("ForwardBatch.init_new: missing")
    mode = need("sglang.srt.model_executor.forward_batch_info", "CaptureHiddenMode")
    if mode is not None and not hasattr(mode, "FULL"):
        problems.append("CaptureHiddenMode.FULL: missing")
    need("sglang.srt.sampling.sampling_params", "SamplingParams", ("temperature", "max_new_tokens"))
    for modname, cls in (
        ("sglang.srt.models.llama", "LlamaForCausalLM"),
        ("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM"),
        ("sglang.srt.models.kimi_k25", "KimiK25ForConditionalGeneration"),
    ):
        c = need(modname, cls)
        if c is not None and not hasattr(c, "set_eagle3_layers_to_capture"):
            problems.append(f"{cls}.set_eagle3_layers_to_capture: missing")
    return problems


class _NoPrefixCache:
    """The tree cache a `ScheduleBatch` asks for, with nothing cached: capture never reuses a
    prefix (SGLang's `bench_one_batch` hands its batches the same kind of stand-in)."""

    def __init__(self, page_size: int, device, allocator):
        self.page_size = page_size
        self.device = device
        self.token_to_kv_pool_allocator = allocator

    def supports_swa(self) -> bool:
        return False

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return True

    def evict(self, params) -> None:
        pass

    def maybe_hand_to_session(self, req) -> None:
        pass


def use_cpu_engine() -> None:
    """SGLang's CPU engine: `SGLANG_USE_CPU_ENGINE=1` before SGLang is imported (without it SGLang
    0.5.23 imports vLLM's rotary op), and the `sgl_kernel` of `$AERIE_SGLANG_TEST_KERNELS` first
    on the path when set (the test suite's stand-in; PyPI's `sgl_kernel` is CUDA-only)."""
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    kernels = os.environ.get("AERIE_SGLANG_TEST_KERNELS")
    if kernels:
        from aerie_serve.sglang import use_test_kernels

        use_test_kernels(kernels)


class SGLangEngine(Engine):
    """One TP rank's engine. Construct it in every process `torchrun` starts."""

    def __init__(
        self,
        target: str,
        aux_layers: list[int],
        final_hidden: bool,
        topk: Optional[int],
        tp_size: int,
        attention_backend: str = "flashinfer",
        mem_fraction_static: float = 0.85,
        max_batch_tokens: int = 32768,
        max_batch_samples: int = 64,
        trust_remote_code: bool = False,
        device: str = "cuda",
        dtype: str = "auto",
    ):
        if device == "cpu":
            use_cpu_engine()
        problems = check_api()
        if problems:
            raise RuntimeError("the installed SGLang does not match the engine:\n  " + "\n  ".join(problems))
        import sglang
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed import bootstrap
        from sglang.srt.entrypoints.engine import _set_envs_and_config
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
        from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.runtime_context import SpawnRanks, get_device, get_schedule, publish, spawn_world_rank
        from sglang.srt.server_args import PortArgs, ServerArgs

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != tp_size:
            raise RuntimeError(f"--tp {tp_size} but {world} processes were started (torchrun --nproc-per-node must equal --tp)")
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.tp_size = tp_size
        self.is_writer = self.rank == 0
        if device != "cpu":
            torch.cuda.set_device(self.local_rank)
        self.final_hidden = final_hidden
        self.topk = topk

        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
        text = hf.get_text_config()
        arch = (getattr(hf, "architectures", None) or [type(hf).__name__])[0]
        self.info = TargetInfo(int(text.num_hidden_layers), int(text.hidden_size), int(text.vocab_size), arch)
        self.aux_layers = list(aux_layers)
        self._capture = layers_to_capture(self.aux_layers, self.info.num_layers)

        server_args = ServerArgs(
            model_path=target,
            tp_size=tp_size,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            skip_tokenizer_init=True,
            disable_radix_cache=True,
            chunked_prefill_size=-1,
            disable_cuda_graph=True,
            attention_backend=attention_backend,
            mem_fraction_static=mem_fraction_static,
            max_running_requests=max_batch_samples,
            max_total_tokens=max(2 * max_batch_tokens, 8192),
        )
        server_args.resolve_once()
        _set_envs_and_config(server_args)
        port_args = PortArgs.init_new(server_args)
        # Every rank must meet on one port: derive it from torchrun's rendezvous port instead of
        # the random free port PortArgs picks per process.
        if world > 1:
            port_args.nccl_port = int(os.environ.get("MASTER_PORT", "29500")) + 1
        ranks = SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=self.rank, pp_rank=0), gpu_id=self.local_rank)
        publish(server_args, role="scheduler", ranks=ranks)
        for init in (initialize_moe_config, initialize_fp8_gemm_config, initialize_bf16_gemm_config, initialize_fp4_gemm_config):
            init()
        model_config = ModelConfig.from_server_args(server_args)
        bootstrap.init_parallel_runtime(server_args=server_args, device=get_device().device, dist_port=port_args.nccl_port)
        bootstrap.init_layer_runtime(model_config=model_config)
        self.runner = ModelRunner(
            model_config=model_config,
            mem_fraction_static=mem_fraction_static,
            gpu_id=self.local_rank,
            nccl_port=port_args.nccl_port,
            server_args=server_args,
        )
        self.runner.alloc_memory_pool()
        self.runner.init_attention_backends()
        self.runner.init_cuda_graphs()
        self.page_size = get_schedule().page_size
        self.model_config = model_config
        lm = self.runner.model.language_model if arch in WRAPPED else self.runner.model
        lm.set_eagle3_layers_to_capture(list(self.aux_layers))
        got = list(lm.model.layers_to_capture)
        want_rule = sglang_eagle3_rule(arch, list(self.aux_layers), self.info.num_layers)
        if got != want_rule:
            raise RuntimeError(f"{arch}: SGLang set layers_to_capture {got} for ids {self.aux_layers}, aerie expects SGLang's rule to give {want_rule}")
        # Explicit, so the `ids[0] == 1` heuristic never decides what is captured.
        lm.model.layers_to_capture = list(self._capture)
        self.lm = lm
        # The post-norm final states of every position, as the model hands them to its logits
        # processor (which itself keeps only the last position's in a prefill).
        self._final: Optional[torch.Tensor] = None
        lm.logits_processor.register_forward_pre_hook(self._keep_final)
        self.head = lm.lm_head.weight  # [V_shard, H] on this rank
        start, end = vocab_shard(self.info.vocab_size, tp_size, self.rank)
        if self.head.shape[0] != end - start:
            raise RuntimeError(f"{arch}: lm_head shard has {self.head.shape[0]} rows on rank {self.rank}, expected {end - start}")
        self.vocab_start = start
        backend = getattr(server_args, "attention_backend", None) or attention_backend
        self.description = f"sglang {sglang.__version__}, tp{tp_size}, {device}, {backend}, torch {torch.__version__}"
        self._checked_width = False

    def _keep_final(self, module, args):
        self._final = args[1]

    def broadcast(self, value):
        obj = [value]
        torch.distributed.broadcast_object_list(obj, src=0)
        return obj[0]

    def _forward(self, batch: list[list[int]]):
        from array import array

        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        reqs = []
        for i, ids in enumerate(batch):
            req = Req(rid=str(i), origin_input_text="", origin_input_ids=array("q", ids), sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.logprob_start_len = -1
            req.extend_end = len(req.origin_input_ids)
            reqs.append(req)
        allocator = self.runner.token_to_kv_pool_allocator
        sb = ScheduleBatch.init_new(
            reqs=reqs,
            req_to_token_pool=self.runner.req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            tree_cache=_NoPrefixCache(self.page_size, self.runner.device, allocator),
            model_config=self.model_config,
            enable_overlap=False,
            spec_algorithm=SpeculativeAlgorithm.NONE,
        )
        sb.prepare_for_extend()
        if sb.input_ids is None and getattr(sb, "prefill_input_ids_cpu", None) is not None:
            sb.input_ids = sb.prefill_input_ids_cpu.to(sb.device)
            sb.prefill_input_ids_cpu = None
        fb = ForwardBatch.init_new(sb, self.runner, return_hidden_states_before_norm=False)
        fb.capture_hidden_mode = CaptureHiddenMode.FULL
        self._final = None
        out = self.runner.forward(fb)
        lo = getattr(out, "logits_output", out)
        aux, final = lo.hidden_states, self._final
        self._final = None
        self.runner.req_to_token_pool.clear()
        allocator.clear()
        return aux, final

    @torch.inference_mode()
    def capture(self, batch: list[list[int]]) -> list[CaptureOutput]:
        lens = [len(ids) for ids in batch]
        aux, final = self._forward(batch)
        width = len(self.aux_layers) * self.info.hidden_size
        if not self._checked_width:
            if aux is None or tuple(aux.shape) != (sum(lens), width):
                raise RuntimeError(f"SGLang returned aux of shape {None if aux is None else list(aux.shape)}, expected [{sum(lens)}, {width}]")
            if final is None or tuple(final.shape) != (sum(lens), self.info.hidden_size):
                raise RuntimeError(f"SGLang's logits processor got final states of shape {None if final is None else list(final.shape)}")
            self._checked_width = True
        tid = tlp = None
        if self.topk:
            tid, tlp = self._topk(final)
        if not self.is_writer:
            return []
        parts = [split_packed(x, lens) if x is not None else [None] * len(lens) for x in (aux, final if self.final_hidden else None, tid, tlp)]
        return [CaptureOutput(a, f, i, l) for a, f, i, l in zip(*parts)]

    def _topk(self, final: torch.Tensor, chunk: int = 4096):
        """Exact top-k over the vocab-sharded head: local top-k and logsumexp per rank in token
        chunks, gathered (K·8 + 4 bytes per token per rank), merged on rank 0."""
        k = self.topk
        ids_out, lp_out = [], []
        for part in final.split(chunk):
            logits = part @ self.head.t()
            v, i, lse = shard_topk(logits, k, self.vocab_start, self.info.vocab_size)
            if v.shape[-1] < k:  # a shard with fewer real rows than K (tiny models): pad
                pad = k - v.shape[-1]
                v = torch.cat([v, v.new_full((v.shape[0], pad), float("-inf"))], -1)
                i = torch.cat([i, i.new_zeros((i.shape[0], pad))], -1)
            gv = [torch.empty_like(v) for _ in range(self.tp_size)]
            gi = [torch.empty_like(i) for _ in range(self.tp_size)]
            gl = [torch.empty_like(lse) for _ in range(self.tp_size)]
            torch.distributed.all_gather(gv, v.contiguous())
            torch.distributed.all_gather(gi, i.contiguous())
            torch.distributed.all_gather(gl, lse.contiguous())
            ids, lp = merge_topk(list(zip(gv, gi, gl)), k)
            ids_out.append(ids)
            lp_out.append(lp)
        return torch.cat(ids_out), torch.cat(lp_out)

    def shutdown(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
