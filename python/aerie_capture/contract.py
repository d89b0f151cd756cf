"""What aerie hands the worker: the shard metadata it computed and checked
(crates/aerie-capture/src/contract.rs), and the engine defaults the prepared data implies. The
worker never recomputes a rule aerie owns (aux layers, vocabulary, tokenizer digest)."""

from __future__ import annotations

import argparse
import json

from .data import PreparedDataset
from .shards import Metadata


def metadata_arg(a: argparse.Namespace) -> Metadata:
    """`--metadata`, parsed and validated as the shard reader does."""
    try:
        m = json.loads(a.metadata)
    except ValueError as e:
        raise SystemExit(f"--metadata: not JSON ({e})") from None
    if not isinstance(m, dict) or not all(isinstance(v, str) for v in m.values()):
        raise SystemExit("--metadata: not a JSON object of strings (the shard header's map)")
    return Metadata.from_map(m, "--metadata")


def max_model_len(a: argparse.Namespace, data: PreparedDataset) -> None:
    """The vLLM engine's `--max-model-len` default: the prepared data's longest sample plus
    the one token vLLM generates."""
    if a.max_model_len is None and data.max_length:
        a.max_model_len = data.max_length + 1
