#!/usr/bin/env bash
# Long outputs (issue 45): does a drafter's acceptance fall with output position, and does
# training on long answers beat the same answers cut short? docs/training.md ("Long outputs")
# has the measured table and what it says.
#
#   bash scripts/long_outputs.sh WORKDIR [SEEDS]     # SEEDS default "0 1"; needs `aerie` on PATH
#
# The world: SmolLM2-135M-Instruct's own greedy answers (up to 1024 new tokens) to ShareGPT
# prompts from record 3000 on (past the quickstart's), 88 trained on and 24 held out. The warm
# start is the quickstart's drafter (tests/fixtures/smollm2-135m-eagle3, trained on answers cut
# at 384 tokens). Each fine-tune: 2 epochs, one sample per step, lr 5e-4, K = 2, on the answers
# cut at 1536 tokens (whole) or at 384 (the quickstart's cut); every drafter scored by
# `eval accept --rule greedy --k 2` on the held-out answers (f32), with τ by output-position
# bucket. Every stage is skipped when its output exists, so an interrupted run resumes.
# Measured 2026-12-06 on 2 cores beside builds and tests (upper bounds): regeneration 43 min (118
# answers), captures 6.5 min (294-379 tokens/s), four fine-tunes 11 min (61-331 s), five scores
# about 1.5 min each: about 70 minutes in all.
set -euo pipefail
work="$(realpath -m "${1:?usage: long_outputs.sh WORKDIR [SEEDS]}")"
seeds="${2:-0 1}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
warm="$repo/tests/fixtures/smollm2-135m-eagle3"
mkdir -p "$work/runs"
cd "$work"

aerie assets fetch all >/dev/null
assets="${AERIE_HOME:-$HOME/.cache/aerie}/assets"
[ -f smollm2/config.json ] || aerie import gguf "$assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" --out smollm2

# 160 single-turn prompts from ShareGPT record 3000 on (the asset is truncated mid-record: read
# record by record).
[ -f prompts.jsonl ] || python3 - "$assets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json" <<'EOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
dec, i, n, out = json.JSONDecoder(), text.index("[") + 1, 0, []
while len(out) < 160:
    while text[i] in " \n\r\t,":
        i += 1
    rec, i = dec.raw_decode(text, i)
    n += 1
    turns = rec.get("conversations", [])
    if n >= 3000 and turns and turns[0].get("from") == "human" and 20 < len(turns[0]["value"]) < 1500:
        out.append(json.dumps(rec) + "\n")
open("prompts.jsonl", "w").writelines(out)
EOF
[ -f regenerated.jsonl ] || aerie regenerate --target smollm2 --data prompts.jsonl --out regenerated.jsonl \
  --max-samples 112 --max-new-tokens 1024 --max-length 1536 --batch-size 16 --max-turns 1
[ -f train.jsonl ] || { head -n 88 regenerated.jsonl > train.jsonl; sed -n 89,112p regenerated.jsonl > heldout.jsonl; }

capture() { # prepared shards dtype
  [ -f "$2/.complete" ] || { aerie capture --target smollm2 --data "$1" --out "$2" --split train \
    --teacher final-hidden --dtype "$3"; touch "$2/.complete"; }
}
for cut in 1536 384; do
  [ -f "prep-$cut/report.json" ] || aerie data prepare --data train.jsonl --tokenizer smollm2 \
    --out "prep-$cut" --max-length "$cut" --json > "prep-$cut.json"
  capture "prep-$cut" "shards-$cut" bf16
done
[ -f prep-heldout/report.json ] || aerie data prepare --data heldout.jsonl --tokenizer smollm2 \
  --out prep-heldout --max-length 1536 --json > prep-heldout.json
capture prep-heldout shards-heldout f32

score() { # name drafter
  [ -f "score-$1.json" ] || aerie eval accept --drafter "$2" --data shards-heldout --target-head smollm2 \
    --k 2 --rule greedy --answer-budget 1024 --json > "score-$1.json"
}
score warm "$warm"
for seed in $seeds; do
  for cut in 1536 384; do
    name="cut$cut-s$seed"
    cat > "runs/$name.toml" <<TOML
# scripts/long_outputs.sh: answers cut at $cut tokens, seed $seed.
seed = $seed
output_dir = "$work/runs/$name"
ttt_length = 2
step_weight_decay = 0.8
loss = "soft_ce"
log_every = 10
eval_every = 0
save_every = 1000000
keep_last = 1

[data]
train = ["$work/shards-$cut"]
eval = []
batch_tokens = 1

[init]
kind = "warm_start"
drafter = "$warm"

[target]
path = "$work/smollm2"

[optim]
lr = 5e-4
warmup_ratio = 0.05
max_grad_norm = 0.5
epochs = 2
TOML
    [ -f "runs/$name/summary.json" ] || aerie train "runs/$name.toml" > "runs/$name.log" 2>&1
    score "$name" "$(ls -d "runs/$name"/checkpoint-* | sort -t- -k2 -n | tail -1)"
  done
done

# The table: τ over all cycles and by where in the answer each cycle started.
python3 - <<'EOF'
import glob, json
print("| drafter | τ | τ 0-256 (cycles) | τ 256-1k (cycles) |\n|---|---:|---:|---:|")
for f in sorted(glob.glob("score-*.json")):
    d = json.load(open(f))
    b = {x["bucket"]: x for x in d["profile"]["output_position_buckets"]}
    cell = lambda k: f"{b[k]['mean_accept_length']:.3f} ({int(b[k]['cycles'])})" if b[k]["cycles"] else "-"
    print(f"| {f[6:-5]} | {d['tau']:.3f} | {cell('0-256')} | {cell('256-1k')} |")
EOF
