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


class Engine:
    """What the worker asks of every engine. A subclass sets `info` (what it loaded),
    `aux_layers` (the output-of-layer ids it captures, exactly those aerie passed) and
    `description` (for `created_by`), and implements `capture`; the defaults are those of an
    engine in one process, which writes the dataset itself."""

    info: TargetInfo
    aux_layers: list[int]
    description: str
    # Whether this process owns the dataset (lock, resume, writes): SGLang's rank 0 alone.
    is_writer: bool = True

    def capture(self, batch: list[list[int]]) -> list[CaptureOutput]:
        raise NotImplementedError

    def broadcast(self, value):
        """`value` of the writing process, on every process (the identity in one process)."""
        return value

    def shutdown(self) -> None:
        """Release what the engine holds (temp files, the process group)."""

    def check_metadata(self, md) -> None:
        """aerie computed the shard metadata `md` (a `shards.Metadata`) from the target's
        `config.json` and made every check that needs no engine (aux range, vocabulary,
        tokenizer digest; crates/aerie-capture/src/contract.rs). What is left is what only the
        engine can say: the model it loaded has that shape, and it captures those layers."""
        got = {"target_num_layers": self.info.num_layers, "hidden_size": self.info.hidden_size, "target_vocab_size": self.info.vocab_size}
        bad = [f"{k}: aerie computed {getattr(md, k)}, the engine loaded {v}" for k, v in got.items() if getattr(md, k) != v]
        if list(self.aux_layers) != list(md.aux_layer_ids):
            bad.append(f"aux_layer_ids: aerie asked {md.aux_layer_ids}, the engine captures {self.aux_layers}")
        if bad:
            raise SystemExit(f"{self.description}: the engine's model differs from the metadata aerie computed:\n  " + "\n  ".join(bad))


# Modules the worker needs beside torch and the engine, with what each is for.
WORKER_MODULES = {"pyarrow": "reading the prepared dataset's parquet", "safetensors": "writing the shards"}


def missing_worker_modules() -> list[str]:
    """The worker's own requirements that the interpreter lacks, each with what it is for; run
    before an engine is loaded (a minute for vLLM), so a bare engine venv fails at once."""
    import importlib.util

    return [f"{m} ({why}): pip install {m}" for m, why in WORKER_MODULES.items() if importlib.util.find_spec(m) is None]


def build_engine(a, aux: list[int], teacher) -> Engine:
    """The engine the worker's arguments `a` name (`--engine` and its options), capturing the
    output-of-layer ids `aux` (as aerie computed and checked them) and what `teacher` (a
    `shards.Teacher`) needs. Shared by the capture loop (`worker`) and the self-test
    (`selftest`)."""
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
            kv_cache_gb=a.kv_cache_gb,
            max_model_len=a.max_model_len,
            enforce_eager=not a.vllm_compile,
            tmp_dir=a.vllm_tmp,
            trust_remote_code=a.trust_remote_code,
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
        device=a.sglang_device,
        dtype=str(DTYPES[a.compute_dtype]).removeprefix("torch.") if a.compute_dtype else "auto",
    )
