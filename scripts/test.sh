#!/usr/bin/env bash
# The README's test command: every unit, reference and end-to-end test on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked --workspace "$@"
