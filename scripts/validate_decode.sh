#!/usr/bin/env bash
# Validate offline acceptance and the cost model against real speculative decoding on the native
# target (docs/decoding.md):
#   1. the first turns of N MT-Bench questions, answered by the target itself (greedy regenerate);
#   2. those answers prepared and captured in f32 (the features decoding sees);
#   3. `aerie eval accept --rule greedy` on the capture  -> offline τ(k);
#   4. `aerie eval decode` on the same prompts            -> decoding τ, measured speedup, costs;
#   5. `aerie project` of the offline curve with the measured costs -> projected speedup;
# and prints offline vs decoding τ and projected vs measured speedup with their relative errors.
#
# usage: scripts/validate_decode.sh TARGET_DIR DRAFTER_DIR [N_PROMPTS] [MAX_NEW_TOKENS] [K] [WORK_DIR]
set -euo pipefail

target=${1:?target directory}
drafter=${2:?drafter directory}
n=${3:-8}
max_new=${4:-64}
k=${5:-3}
work=${6:-$(mktemp -d /tmp/aerie-validate.XXXXXX)}
aerie=${AERIE:-aerie}
mtbench=${MTBENCH:-${AERIE_HOME:-$HOME/.cache/aerie}/assets/mtbench/question.jsonl}
mkdir -p "$work"
echo "work dir: $work" >&2

# First turns only: decoding answers each prompt once from the same rendered prompt.
python3 - "$mtbench" "$n" "$work" <<'EOF'
import json, sys
src, n, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
qs = [json.loads(l) for l in open(src) if l.strip()][:n]
with open(f"{work}/prompts.jsonl", "w") as f:
    for q in qs:
        f.write(json.dumps({"id": str(q["question_id"]), "prompt": q["turns"][0]}) + "\n")
with open(f"{work}/conversations.jsonl", "w") as f:
    for q in qs:
        conv = [{"from": "human", "value": q["turns"][0]}, {"from": "gpt", "value": "(regenerated)"}]
        f.write(json.dumps({"id": str(q["question_id"]), "conversations": conv}) + "\n")
EOF

[ -f "$work/own.jsonl" ] || "$aerie" regenerate --target "$target" --data "$work/conversations.jsonl" \
    --out "$work/own.jsonl" --max-new-tokens "$max_new" --temperature 0
[ -d "$work/prepared" ] || "$aerie" data prepare --data "$work/own.jsonl" --tokenizer "$target" \
    --out "$work/prepared" --split eval=0 --max-length 4096
[ -d "$work/shards" ] || "$aerie" capture --target "$target" --data "$work/prepared" --out "$work/shards" --dtype f32
"$aerie" eval accept --drafter "$drafter" --data "$work/shards" --target-head "$target" --k "$k" \
    --rule greedy --answer-budget "$max_new" --json > "$work/accept.json"
[ -f "$work/decode.json" ] || "$aerie" eval decode --target "$target" --drafter "$drafter" \
    --prompts "$work/prompts.jsonl" --k "$k" --max-new-tokens "$max_new" \
    --out "$work/decode.json" --costs-out "$work/costs.toml" > /dev/null
"$aerie" project --accept "$work/accept.json" --costs "$work/costs.toml" --json > "$work/project.json"

python3 - "$work" "$k" <<'EOF'
import json, sys
work, k = sys.argv[1], int(sys.argv[2])
acc = json.load(open(f"{work}/accept.json"))
dec = json.load(open(f"{work}/decode.json"))
proj = json.load(open(f"{work}/project.json"))
row = next(r for r in proj["rows"] if r["k"] == k)
tau_off, tau_dec = acc["tau"], dec["tau"]
s_proj, s_meas = row["speedup"], dec["speedup"]
out = {
    "k": k,
    "offline_tau": tau_off, "offline_positions": acc["positions"],
    "offline_cycles": acc["cycles"][k - 1], "decode_within_answers": dec["within_answers"],
    "captured_not_target_argmax": acc["captured_not_target_argmax"],
    "decode_tau": tau_dec, "decode_cycles": dec["cycles"],
    "tau_rel_error": tau_off / tau_dec - 1,
    "projected_speedup": s_proj, "measured_speedup": s_meas,
    "speedup_rel_error": s_proj / s_meas - 1,
    "greedy_identical": dec.get("greedy_identical"),
    "t_d_ms": dec["costs"]["t_d_ms"], "t_s_ms": dec["costs"]["t_s_ms"], "t_v_ms": dec["costs"]["t_v_ms"],
    "cycle_ms": dec["costs"]["cycle_ms"],
}
json.dump(out, open(f"{work}/validation.json", "w"), indent=1)
print(json.dumps(out, indent=1))
EOF
