"""Capture engines. Each turns a batch of token-id lists into per-sample rows, unshifted
(docs/shard-format.md §3): `aux` [T, A·H] (output-of-layer ids, concatenated low → high),
`final` [T, H] after the final norm, and the exact top-k teacher, on whatever device the engine
runs; the worker moves them to the host and writes them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

import torch

# `--compute-dtype` of the transformers engine.
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@dataclass
class CaptureOutput:
    aux: torch.Tensor
    final: Optional[torch.Tensor]
    topk_ids: Optional[torch.Tensor]
    topk_logprobs: Optional[torch.Tensor]


@dataclass(frozen=True)
class TargetInfo:
    """What the shard metadata says about the target."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    architecture: str


class SeamCheck:
    """The names an engine uses inside a serving engine's package (SGLang, vLLM), checked against
    the installed package without loading a model; every problem is collected, so one run names
    them all, and an upgrade fails here instead of mid-capture."""

    def __init__(self):
        self.problems: list[str] = []

    def installed(self, package: str, version: str, install: str):
        """The package, noting a version other than `version`; `None` when it is not importable
        (the problem then says `install`)."""
        try:
            mod = importlib.import_module(package)
        except ImportError as e:
            self.problems.append(f"{package} is not importable ({e}); {install}")
            return None
        if getattr(mod, "__version__", None) != version:
            self.problems.append(f"{package} {getattr(mod, '__version__', '?')} is installed; this engine is written for {version}")
        return mod

    def need(self, modname: str, attr: str):
        """`modname.attr`, or `None` with the problem noted."""
        try:
            mod = __import__(modname, fromlist=[attr])
            return getattr(mod, attr)
        except (ImportError, AttributeError) as e:
            self.problems.append(f"{modname}.{attr}: missing ({e})")
            return None


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default, as aerie's native capture (`AuxLayers::default_for_target`)."""
    return [1, max(num_layers // 2 - 1, 0), max(num_layers - 4, 0)]


def check_aux_layers(ids: list[int], num_layers: int) -> None:
    """Output-of-layer ids must be strictly increasing and below the last layer: the output of
    layer L-1 is never a pre-norm capture (transformers' last `hidden_states` entry is already
    normed, SGLang captures at the input of the next layer, which does not exist)."""
    if not ids:
        raise ValueError("no aux layers")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"aux layers {ids} must be strictly increasing (low → high)")
    if ids[0] < 0 or ids[-1] >= num_layers - 1:
        raise ValueError(
            f"aux layer {ids[-1] if ids[-1] >= 0 else ids[0]} (output-of-layer) cannot be captured from a target with "
            f"{num_layers} layers (valid: 0..{num_layers - 2}; the last layer's output is only seen after the final norm)"
        )


def build_engine(a, aux: Optional[list[int]], teacher, max_sample_tokens: Optional[int] = None):
    """The engine the worker's arguments `a` name (`--engine` and its options), capturing the
    aux layers `aux` (None: EAGLE-3's default) and what `teacher` (a `shards.Teacher`) needs.
    `max_sample_tokens`: the longest sample it will see (the prepared data's `max_length`), which
    bounds vLLM's context. Shared by the capture loop (`worker`) and the self-test (`selftest`)."""
    if a.engine == "transformers":
        from .hf import TransformersEngine

        dev = a.device
        cdt = DTYPES[a.compute_dtype] if a.compute_dtype else (torch.float32 if dev == "cpu" else torch.bfloat16)
        return TransformersEngine(a.target, aux, teacher.final_hidden, teacher.topk, dev, cdt, a.trust_remote_code)
    if a.engine == "vllm":
        from .vllm import VllmEngine

        return VllmEngine(
            a.target,
            aux,
            teacher.final_hidden,
            teacher.topk,
            tp_size=a.tp,
            device=a.device,
            compute_dtype=DTYPES[a.compute_dtype] if a.compute_dtype else None,
            max_batch_tokens=a.max_batch_tokens,
            max_batch_samples=a.max_batch_samples,
            gpu_memory_utilization=a.gpu_memory_utilization,
            enforce_eager=not a.vllm_compile,
            tmp_dir=a.vllm_tmp,
            trust_remote_code=a.trust_remote_code,
            max_sample_tokens=max_sample_tokens,
        )
    from .sglang import SGLangEngine

    return SGLangEngine(
        a.target,
        aux,
        teacher.final_hidden,
        teacher.topk,
        tp_size=a.tp,
        attention_backend=a.attention_backend,
        mem_fraction_static=a.mem_fraction_static,
        max_batch_tokens=a.max_batch_tokens,
        max_batch_samples=a.max_batch_samples,
        trust_remote_code=a.trust_remote_code,
    )
