#!/usr/bin/env bash
# The README's test command: every unit, reference and end-to-end test on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
# burn-flex reduces large tensors in rayon chunks whose association order follows rayon's adaptive
# splitting, so float sums can differ in the last bit between runs when several threads compete.
# The bit-identical resume and data-parallel equality tests need one fixed order: one rayon thread.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-1}"
cargo test --locked --workspace "$@"
