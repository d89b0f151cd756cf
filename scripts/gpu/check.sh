#!/usr/bin/env bash
# aerie's CUDA check (issue 18): one prepared run on a GPU machine with no network and no Rust
# toolchain. On the CPU machine first:
#   scripts/gpu/build.sh        # stripped `--features cuda` binary + SpecForge wheel in .work/gpu/
# then on the GPU machine (the device tool, carrying .work/gpu):
#   bash scripts/gpu/check.sh "$OUT"
# Stages, in order of importance, each with its own time limit and all under one deadline
# (BUDGET_S, default 540 s from the start, so the run ends well inside ten minutes; a stage that
# would start with under 15 s left is skipped and marked so):
#   1. `aerie train --device cuda:0` to the end on a small world (a SmolLM2-shaped random target
#      written by make_world.py), twice, as separate processes: the second starts from the
#      persistent kernel cache aerie keeps in $AERIE_HOME/cubecl; the same 12 steps on the CPU.
#   2. the same run with precision = "bf16" on the GPU.
#   3. the Kimi-shaped drafter layer (AQ-MedAI config), `aerie bench train` in bf16 at L 2048 and
#      4096, and SpecForge 0.2.0's TTT step (scripts/gpu/specforge_ttt.py, the machine's own
#      torch) at the same shapes.
#   4. data parallelism against one replica with grad_accumulation = 2: `--devices cuda:0,cuda:0`
#      (two replicas on one GPU: their gradients summed through host memory, since an NCCL
#      communicator takes each GPU once) and, on a machine with two or more GPUs only,
#      `--devices cuda:0,cuda:1` (the NCCL all-reduce between GPUs). A one-GPU machine cannot run
#      the NCCL path: the script says so and records the stage as skipped.
#   then, if time is left: capture, eval and decode on the GPU against the CPU.
# Results: OUT/*.out|err per stage, OUT/stages.jsonl, OUT/gpu_mem.txt (0.2 s samples), and
# compare.py's OUT/train.json, bf16.json, kimi.json, dp.json, compare.json, summary.json.
# STAGES="1 2 3 4 5" picks stages (default all), for a second run when the first ran out of time.
set -u
OUT=${1:?usage: check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
T_START=$(date +%s.%N)
BUDGET_S=${BUDGET_S:-540}
STAGES=${STAGES:-1 2 3 4 5}
W=${WORLD:-/tmp/aerie-gpu-world}
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-16}
# The persistent kernel cache under test: aerie's default place, empty at the start of the run.
export AERIE_HOME=${AERIE_HOME:-$W/aerie-home}
# Fewest matmul autotune candidates (cubecl reads this variable; aerie's cache config keeps it).
export CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal}
A=${AERIE:-}
if [ -z "$A" ]; then
  if [ -f "$ROOT/.work/gpu/aerie.gz" ]; then
    A=/tmp/aerie-cuda; gzip -dc "$ROOT/.work/gpu/aerie.gz" > "$A" && chmod +x "$A"
  else
    A=$ROOT/.work/gpu/aerie
  fi
fi
WHEEL=${SPECFORGE_WHEEL:-$(ls "$ROOT"/.work/gpu/specforge-0.2.0-*.whl 2>/dev/null | head -1)}
# NVRTC (cubecl compiles its kernels at run time): the CUDA toolkit's first (it matches the
# driver), then a pip wheel's. libnccl (the NCCL all-reduce of stage 4 on two or more GPUs; cudarc
# opens it only then): the system's, else torch's pip wheel's (nvidia/nccl/lib).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "nccl")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
# cudarc 0.19 opens `libnccl.so` (or `.so.<CUDA major>`), never NCCL's soname `libnccl.so.2`, which
# is all that NCCL's runtime package and torch's pip wheel install: give it a link.
lp=${LD_LIBRARY_PATH:-}
nccl2=$(for d in ${lp//:/ } $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF}' | xargs -r -n1 dirname); do
  [ -e "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2"; done | head -1)
if [ -n "$nccl2" ] && [ ! -e "$(dirname "$nccl2")/libnccl.so" ]; then
  mkdir -p /tmp/aerie-nccl && ln -sf "$nccl2" /tmp/aerie-nccl/libnccl.so
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/aerie-nccl"
fi

want() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
left() { awk "BEGIN {printf \"%d\", $BUDGET_S - ($(date +%s.%N) - $T_START)}"; }

stage() { # stage NAME SECONDS CMD...: run with min(SECONDS, time left), log time and status
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -lt 15 ]; then
    echo "=== $name: skipped, ${l} s left"
    echo "{\"stage\": \"$name\", \"rc\": null, \"skipped\": true}" >> "$OUT/stages.jsonl"
    return 125
  fi
  local t0 rc t1
  t0=$(date +%s.%N)
  echo "=== $name (limit ${limit} s): $*"
  timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  rc=$?
  t1=$(date +%s.%N)
  printf '=== %s: rc %s, %s s\n' "$name" "$rc" "$(awk "BEGIN {printf \"%.1f\", $t1 - $t0}")"
  tail -n 3 "$OUT/$name.err"; tail -c 800 "$OUT/$name.out"; echo
  echo "{\"stage\": \"$name\", \"rc\": $rc, \"limit_s\": $limit, \"start\": $t0, \"end\": $t1}" >> "$OUT/stages.jsonl"
  return $rc
}

# train_stage NAME RUNDIR ARGS...: an `aerie train` stage that also records when its first
# metrics line (step 1 done) appeared, for the start-up time, and what the kernel cache holds.
train_stage() {
  local name=$1 run=$2; shift 2
  rm -rf "$run"
  ( while [ ! -s "$run/metrics.jsonl" ]; do sleep 0.05; done; date +%s.%N > "$OUT/$name.first_step" ) &
  local watch=$! rc
  stage "$name" "$@"; rc=$?
  kill $watch 2>/dev/null; wait $watch 2>/dev/null
  cache_stats "$name"
  return $rc
}

cache_stats() { # files and bytes in the kernel cache after a stage
  local c=$AERIE_HOME/cubecl files=0 bytes=0
  if [ -d "$c" ]; then
    files=$(find "$c" -type f | wc -l)
    bytes=$(du -sb "$c" | cut -f1)
  fi
  printf '{"stage": "%s", "files": %s, "bytes": %s}\n' "$1" "${files:-0}" "${bytes:-0}" >> "$OUT/kernel_cache.jsonl"
}

{
  echo "{\"budget_s\": $BUDGET_S, \"stages\": \"$STAGES\", \"autotune\": \"$CUBECL_AUTOTUNE_LEVEL\", \"aerie_home\": \"$AERIE_HOME\", \"wheel\": \"$WHEEL\"}"
} > "$OUT/run.json"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.csv"
# GPU memory in use, sampled every 0.2 s: compare.py takes each stage's peak from it.
(while :; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)"; sleep 0.2; done) > "$OUT/gpu_mem.txt" &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
"$A" --version || exit 1
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 | tee "$OUT/torch.txt"
# A cache elsewhere (AERIE_HOME set by the caller) is kept: the first run is then not cold.
case "$AERIE_HOME" in "$W"/*) ;; *) echo "WARNING: AERIE_HOME=$AERIE_HOME is outside $W: kept, train_cuda_1 may not start cold";; esac
rm -rf "$W" && mkdir -p "$W" && cd "$W"
# aerie's kernel cache applies only where no cubecl.toml/burn.toml configures cubecl.
for d in "$W" /tmp /; do ls "$d"/cubecl.toml "$d"/CubeCL.toml "$d"/burn.toml "$d"/Burn.toml 2>/dev/null; done | sed 's/^/WARNING: cubecl config found, the kernel cache under test is not used: /'

python3 "$HERE/make_world.py" "$W" 30 48
sed -e "s#@WORK@/smollm2#$W/target#g" -e "s#@WORK@#$W#g" "$ROOT/configs/quickstart-smollm2.toml" > train.toml
stage prepare 60 "$A" data prepare --data sharegpt.jsonl --tokenizer target --out prepared --max-length 512 --split eval=0.2
stage vocab 60 "$A" vocab build prepared --draft-vocab 128 --out vocab.safetensors
stage capture_cpu 120 "$A" capture --target target --data prepared --out shards/train --split train --max-samples 4
# Training: 12 steps from the same shards, seed and order on every backend.
T=(train train.toml --set optim.max_steps=12 --set log_every=1 --set data.eval=[] --set save_every=0)

if want 1; then
  stage train_cpu 120 "$A" "${T[@]}" --set output_dir="$W/run-cpu" --json
  # The first CUDA process compiles every kernel it meets (2026-11-30: 361 kernels, 135 s for one
  # tiny TTT step) and fills the cache; the second should find them there.
  train_stage train_cuda_1 "$W/run-cuda" 300 "$A" "${T[@]}" --set output_dir="$W/run-cuda" --device cuda:0 --json; rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 125 ]; then
    ldconfig -p | grep -i -E 'libcuda|nvrtc'; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  fi
  train_stage train_cuda_2 "$W/run-cuda-2" 150 "$A" "${T[@]}" --set output_dir="$W/run-cuda-2" --device cuda:0 --json
fi
if want 2; then
  train_stage train_cuda_bf16 "$W/run-bf16" 180 "$A" "${T[@]}" --set output_dir="$W/run-bf16" --set precision=bf16 --device cuda:0 --json
fi
if want 3; then
  K=(bench train "$ROOT/configs/kimi-k25-finetune.toml" --set init.drafter="$HERE/kimi-k2-drafter" --set precision=bf16 --steps 3 --warmup 1 --device cuda:0 --json)
  S=(python3 "$HERE/specforge_ttt.py" --wheel "$WHEEL" --shape kimi --dtype bf16 --steps 3 --warmup 1 --json)
  for L in 2048 4096; do
    stage kimi_aerie_L$L 150 "$A" "${K[@]}" --seq-len $L
    stage kimi_specforge_L$L 120 "${S[@]}" --seq-len $L; rc=$?
    # Without a C compiler or a working triton, torch.compile and SpecForge's triton loss
    # fail; its eager path with SpecForge's reference loss is then the next best measurement.
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 125 ]; then
      stage kimi_specforge_eager_L$L 90 "${S[@]}" --seq-len $L --no-compile
    fi
  done
fi
if want 4; then
  # Two replicas on one device (each with its weights and AdamW state, gradients summed through
  # host memory): the micro-batch split and the all-reduce seam on CUDA, against one replica
  # accumulating the same two micro-batches per step.
  train_stage dp_two_replicas "$W/run-dp2" 90 "$A" "${T[@]}" --set output_dir="$W/run-dp2" --devices cuda:0,cuda:0 --json
  train_stage dp_accum2 "$W/run-acc2" 90 "$A" "${T[@]}" --set output_dir="$W/run-acc2" --set optim.grad_accumulation=2 --device cuda:0 --json
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${NGPU:-0}" -ge 2 ]; then
    # Two GPUs: one thread per replica, burn's NCCL all-reduce (the path of `--devices cuda:0..7`).
    train_stage dp_nccl "$W/run-nccl" 120 "$A" "${T[@]}" --set output_dir="$W/run-nccl" --devices cuda:0,cuda:1 --json
  else
    echo "=== dp_nccl: NOT RUN: this machine has ${NGPU:-0} GPU; the NCCL all-reduce between GPUs (--devices cuda:0,cuda:1) needs a machine with two or more"
    echo "{\"stage\": \"dp_nccl\", \"rc\": null, \"skipped\": true, \"reason\": \"${NGPU:-0} GPU: the NCCL path needs two or more\"}" >> "$OUT/stages.jsonl"
  fi
fi
if want 5; then
  stage capture_eval_cpu 60 "$A" capture --target target --data prepared --out shards/eval --split eval --max-samples 4
  stage capture_cuda 120 "$A" capture --target target --data prepared --out shards-cuda --split train --max-samples 4 --device cuda:0
  if [ -d "$W/run-cpu/checkpoint-12" ]; then
    stage eval_cpu 60 "$A" eval loss --drafter "$W/run-cpu/checkpoint-12" --data shards/eval --target-head target --ttt-length 3 --json
    stage eval_cuda 120 "$A" eval loss --drafter "$W/run-cpu/checkpoint-12" --data shards/eval --target-head target --ttt-length 3 --json --device cuda:0
    stage export 60 "$A" export "$W/run-cpu/checkpoint-12" --to sglang --out "$W/drafter-sglang" --target target
    stage decode_cuda 150 "$A" eval decode --target target --drafter "$W/drafter-sglang" --prompts prompts.jsonl --max-new-tokens 32 --k 3 --max-prompts 2 --device cuda:0 --json --out "$OUT/decode_cuda.json"
  fi
fi
kill $SMI 2>/dev/null
python3 "$HERE/compare.py" "$W" "$OUT" | tee "$OUT/compare.txt"
python3 "$HERE/compare.py" --memory "$OUT" | tee "$OUT/memory.txt"
echo "total $(awk "BEGIN {printf \"%.0f\", $(date +%s.%N) - $T_START}") s; summary: $OUT/summary.json"
