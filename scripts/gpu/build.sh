#!/usr/bin/env bash
# Prepare, on the CPU machine, everything scripts/gpu/check.sh needs on the GPU machine (which has
# no network and no Rust toolchain), in .work/gpu/ (gitignored), the one path the device run
# carries:
#   .work/gpu/aerie.gz                 the stripped `--features cuda` release binary, gzipped
#   .work/gpu/specforge-0.2.0-*.whl    the reference trainer (scripts/gpu/fetch.sh), + its sha256
# The small world (a SmolLM2-shaped random target, ~540 MB) is written on the GPU machine by
# make_world.py: too large to carry, seconds to make. This script smoke-tests it here with one
# layer, checks the scripts' syntax and that the carried folder fits the 64 MiB carry limit.
#   scripts/gpu/build.sh              # SKIP_CARGO=1 for everything but the cargo build
# Then, on the device tool: command `bash scripts/gpu/check.sh "$OUT"`, carry [".work/gpu"].
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/gpu
DEST=$ROOT/.work/gpu
LIMIT=$((64 * 1024 * 1024))
mkdir -p "$DEST"
cd "$ROOT"

if [ "${SKIP_CARGO:-0}" != 1 ]; then
  # Without the default `wgpu` feature: the GPU machine runs CUDA, and the binary must fit the
  # carry limit (wgpu and naga add several MB); CI runs the wgpu path on lavapipe instead.
  cargo build --release -p aerie-cli --no-default-features --features cuda
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/aerie
  strip -o "$DEST/aerie" "$BIN"
  gzip -9 -c "$DEST/aerie" > "$DEST/aerie.gz"
  rm -f "$DEST/aerie"  # only the gzipped copy travels
  echo "aerie.gz: $(stat -c %s "$DEST/aerie.gz") bytes ($(stat -c %s "$BIN") unstripped)"
else
  echo "SKIP_CARGO=1: cuda binary not built${DEST:+; $( [ -f "$DEST/aerie.gz" ] && echo "existing aerie.gz kept" || echo "no aerie.gz yet")}"
fi

bash "$HERE/fetch.sh"

# Syntax of everything that runs there.
for f in "$HERE"/*.sh; do bash -n "$f"; done
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' "$HERE"/*.py
echo "scripts: syntax ok"

# make_world.py needs numpy and safetensors (the GPU machine has both): smoke-test it with one layer.
PY=${PYTHON:-python3}
if "$PY" -c 'import numpy, safetensors' 2>/dev/null; then
  tmp=$(mktemp -d)
  "$PY" "$HERE/make_world.py" "$tmp" 1 4
  rm -rf "$tmp"
else
  echo "make_world.py not smoke-tested: $PY lacks numpy or safetensors (PYTHON=... to pick another)"
fi

total=$(du -sb "$DEST" | cut -f1)
ls -l "$DEST"
if [ "$total" -ge "$LIMIT" ]; then
  echo "ERROR: .work/gpu is $total bytes, over the 64 MiB the device run carries" >&2
  exit 1
fi
echo ".work/gpu: $total bytes of $LIMIT; carry [\".work/gpu\"], run: bash scripts/gpu/check.sh \"\$OUT\""
[ -f "$DEST/aerie.gz" ] || { echo "NOT READY: no .work/gpu/aerie.gz (run without SKIP_CARGO=1)"; exit 2; }
