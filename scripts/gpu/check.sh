#!/usr/bin/env bash
# aerie's CUDA check: one prepared run on a GPU machine with no network and no Rust toolchain.
# Carry a stripped binary built here with `--features cuda` (gzipped to travel) as
# .work/gpu/aerie.gz, unpack it there and run
#   AERIE=/tmp/aerie bash scripts/gpu/check.sh OUTDIR
# It builds a SmolLM2-shaped random target (scripts/gpu/make_world.py), runs capture, train, eval
# and decode on cuda:0 and the same inputs on the CPU, compares them (scripts/gpu/compare.py),
# and benchmarks the TTT step (SmolLM2 and Kimi-K2 drafter shapes, f32 and bf16). Stages run in
# order of importance, each with its own time limit, so a slow one cannot take the rest with it.
set -u
OUT=${1:?usage: check.sh OUTDIR}
mkdir -p "$OUT"
A=${AERIE:-$PWD/.work/gpu/aerie}
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORLD:-/tmp/aerie-gpu-world}
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-16}
# NVRTC (cubecl compiles its kernels at run time): the CUDA toolkit's first (it matches the
# driver), then a pip wheel's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

stage() { # stage NAME SECONDS CMD...: run with a limit, log time and status
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s.%N) rc
  echo "=== $name: $*"
  timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$? t1=$(date +%s.%N)
  printf '=== %s: rc %s, %s s\n' "$name" "$rc" "$(awk "BEGIN {printf \"%.1f\", $t1 - $t0}")"
  tail -n 3 "$OUT/$name.err"; tail -c 1500 "$OUT/$name.out"; echo
  echo "{\"stage\": \"$name\", \"rc\": $rc, \"start\": $t0, \"end\": $t1}" >> "$OUT/stages.jsonl"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
# GPU memory in use, sampled every 0.2 s: compare.py takes each stage's peak from it.
(while :; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)"; sleep 0.2; done) > "$OUT/gpu_mem.txt" &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
"$A" --version || exit 1
rm -rf "$W" && mkdir -p "$W" && cd "$W"
# cubecl reads cubecl.toml from the working directory: kernels compiled by one stage are reused by
# the next (the compilation cache), autotuning tries the fewest candidates, compiles are logged.
cat > cubecl.toml <<TOML
[compilation]
cache = "global"
[compilation.logger]
level = "basic"
file = "$OUT/cubecl-compile.log"
[autotune]
level = "${CUBECL_AUTOTUNE:-minimal}"
[autotune.logger]
level = "minimal"
file = "$OUT/cubecl-autotune.log"
TOML
python3 "$HERE/make_world.py" "$W" 30 48
sed -e "s#@WORK@/smollm2#$W/target#g" -e "s#@WORK@#$W#g" "$HERE/../../configs/quickstart-smollm2.toml" > train.toml
stage prepare 60 "$A" data prepare --data sharegpt.jsonl --tokenizer target --out prepared --max-length 512 --split eval=0.2
stage vocab 60 "$A" vocab build prepared --draft-vocab 128 --out vocab.safetensors
stage capture_cpu 120 "$A" capture --target target --data prepared --out shards/train --split train --max-samples 4
stage capture_eval_cpu 120 "$A" capture --target target --data prepared --out shards/eval --split eval --max-samples 4
# Training: 12 steps on each backend from the same shards, seed and order.
T=(train train.toml --set optim.max_steps=12 --set log_every=1 --set data.eval=[] --set save_every=0)
stage train_cpu 120 "$A" "${T[@]}" --set output_dir="$W/run-cpu" --json
# The first CUDA process compiles every kernel it meets with NVRTC (2026-11-30, H200: 361 kernels
# in 135 s for one tiny TTT step, one CPU core busy; matmul autotuning is most of them), so the
# first GPU stage gets the longest limit. A fast failure there is a loader problem: show it, stop.
stage train_cuda 420 "$A" "${T[@]}" --set output_dir="$W/run-cuda" --device cuda:0 --json; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then
  ldconfig -p | grep -i -E 'libcuda|nvrtc'; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  exit 1
fi
wc -l "$OUT"/cubecl-*.log
stage bench_smollm2_L2048_f32 240 "$A" bench ttt --shape smollm2 --seq-len 2048 --batch 4 --steps 5 --warmup 2 --device cuda:0 --json
stage train_cuda_bf16 150 "$A" "${T[@]}" --set output_dir="$W/run-bf16" --set precision=bf16 --device cuda:0 --json
stage capture_cuda 120 "$A" capture --target target --data prepared --out shards-cuda --split train --max-samples 4 --device cuda:0
stage eval_cpu 60 "$A" eval loss --drafter "$W/run-cpu/checkpoint-12" --data shards/eval --target-head target --ttt-length 3 --json
stage eval_cuda 120 "$A" eval loss --drafter "$W/run-cpu/checkpoint-12" --data shards/eval --target-head target --ttt-length 3 --json --device cuda:0
stage export 60 "$A" export "$W/run-cpu/checkpoint-12" --to sglang --out "$W/drafter-sglang" --target target
stage decode_cuda 150 "$A" eval decode --target target --drafter "$W/drafter-sglang" --prompts prompts.jsonl --max-new-tokens 32 --k 3 --max-prompts 2 --device cuda:0 --json --out "$OUT/decode_cuda.json"
python3 "$HERE/compare.py" "$W" "$OUT" | tee "$OUT/compare.txt"
stage bench_smollm2_L2048_bf16 120 "$A" bench ttt --shape smollm2 --seq-len 2048 --batch 4 --steps 5 --warmup 2 --precision bf16 --device cuda:0 --json
for p in bf16 f32; do
  stage bench_kimi_L2048_$p 200 "$A" bench train "$HERE/../../configs/kimi-k25-finetune.toml" --set init.drafter="$HERE/kimi-k2-drafter" --set precision=$p --seq-len 2048 --steps 3 --warmup 1 --device cuda:0 --json
done
kill $SMI
python3 "$HERE/compare.py" --memory "$OUT" | tee "$OUT/memory.txt"
