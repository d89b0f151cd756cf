#!/usr/bin/env bash
# The README's test command: every unit, reference and end-to-end test on the CPU backend.
#
# With cargo-nextest installed (it is on CI's machines) the tests run in its pool, two at a time,
# the slowest first (.config/nextest.toml), and the doc tests after them (nextest does not run doc
# tests); without it, `cargo test` runs them one binary after another. Arguments go to whichever
# runs (`AERIE_TEST_RUNNER=cargo` chooses `cargo test`); `--no-run` only builds the tests, as .ci/run
# does while its Python venvs install.
set -euo pipefail
cd "$(dirname "$0")/.."
# burn-flex reduces large tensors in rayon chunks whose association order follows rayon's adaptive
# splitting, so float sums can differ in the last bit between runs when several threads compete.
# The bit-identical resume and data-parallel equality tests need one fixed order: one rayon thread.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-1}"
if [ "${AERIE_TEST_RUNNER:-}" != cargo ] && cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --workspace "$@"
  case " $* " in
    *" --no-run "*) ;;
    *) cargo test --locked --workspace --doc ;;
  esac
else
  cargo test --locked --workspace "$@"
fi
