"""aerie's Python capture worker: writes aerie-shard/1 (docs/shard-format.md) from a target that
aerie's native Rust engine does not run, in process, through transformers (CPU or GPU) or SGLang
(tensor-parallel GPUs). `aerie capture --engine transformers|sglang` launches it; it can also be
run directly as `python -m aerie_capture ...` (or under `torchrun` for SGLang)."""

# Kept equal to the Rust workspace version (Cargo.toml), so `created_by` names one release.
__version__ = "0.1.0"
