#!/usr/bin/env bash
# Fetch, on the CPU machine (it has PyPI; the GPU machine has no network), what the GPU check
# carries besides aerie: SpecForge 0.2.0's wheel, the reference trainer that
# scripts/gpu/specforge_ttt.py times on the same GPU (scripts/specforge_finetune.py, the reference
# row of `aerie bench shift`, uses the same wheel on the CPU). The wheel is pure Python; it is downloaded
# without its dependencies (the GPU machine's preinstalled torch is used, and specforge_ttt.py
# stubs the imports this path does not use) and never installed: specforge_ttt.py puts it on
# sys.path. Writes .work/gpu/specforge-0.2.0-*.whl and .work/gpu/specforge.sha256.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=$ROOT/.work/gpu
VERSION=${SPECFORGE_VERSION:-0.2.0}
mkdir -p "$DEST"
rm -f "$DEST"/specforge-*.whl
python3 -m pip download --no-deps --only-binary=:all: --dest "$DEST" "specforge==$VERSION"
WHEEL=$(ls "$DEST"/specforge-"$VERSION"-*.whl)
(cd "$DEST" && sha256sum "$(basename "$WHEEL")" | tee specforge.sha256)
echo "$(basename "$WHEEL"): $(stat -c %s "$WHEEL") bytes"
