#!/usr/bin/env bash
# `make demo`: the omrl chain on built-in defaults, offline, on the CPU.
#   1. data chain: tasks -> collect (scripted expert, random, tiny in-process model) -> annotate -> filter -> query
#   2. learning demo: recipes/quickstart.yaml through `omrl train iterate` (same as `omrl demo`): the expert's
#      own success, the untrained model, expert demos -> SFT -> GRPO rounds, and a compute-matched more-SFT
#      baseline on the grid env, held-out success per stage, then `omrl report` plots and a summary
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OMRL=".venv/bin/omrl"
RUN="runs/demo"
STORE="$RUN/store"
rm -rf "$RUN"
mkdir -p "$RUN"

step() { printf '\n\033[1;34m== %s ==\033[0m\n' "$*"; }

step "1. the data chain on shipped tasks (math, shop, code) and the tiny offline model"
"$OMRL" models tiny --out "$RUN/tiny" --hidden 64
"$OMRL" collect --env math --tasks datasets/tasks/math_arith.jsonl --policy scripted --store "$STORE" --samples 2 --limit 30
"$OMRL" collect --env math --tasks datasets/tasks/math_arith.jsonl --policy random --store "$STORE" --samples 4 --limit 30 --max-turns 4
"$OMRL" collect --env shop --tasks datasets/tasks/shop.jsonl --policy scripted --store "$STORE" --samples 2 --limit 10
"$OMRL" collect --env code --tasks datasets/tasks/code.jsonl --policy scripted --store "$STORE" --limit 5
"$OMRL" collect --env grid --tasks datasets/tasks/grid_eval.jsonl --policy "hf:$RUN/tiny" --store "$STORE" --samples 2 --limit 8 --max-turns 4 --max-tokens 8
"$OMRL" annotate "$STORE" --metric success --metric numeric_match --metric num_turns --metric format_valid --metric tool_error_rate
"$OMRL" filter "$STORE" --out "$RUN/sft-set" --status ok --success --dedupe exact --split val=0.1
"$OMRL" stats "$STORE"
ID=$("$OMRL" query "$STORE" "SELECT id FROM trajectories WHERE env = 'shop' AND success ORDER BY id LIMIT 1" --format csv | tail -1 | tr -d '"')
"$OMRL" show "$STORE" "$ID"
"$OMRL" query "$STORE" "SELECT env, model, count(*) AS n, round(avg(reward), 3) AS mean_reward FROM trajectories GROUP BY ALL ORDER BY ALL"
"$OMRL" query "$STORE" "SELECT name, count(*) AS calls FROM tool_calls GROUP BY name ORDER BY calls DESC"
"$OMRL" query "$STORE" "SELECT env, count(*) AS groups, count(*) FILTER (WHERE std_reward > 0) AS with_signal FROM groups JOIN (SELECT DISTINCT group_id, env FROM trajectories) USING (group_id) GROUP BY env ORDER BY env"
"$OMRL" query "$STORE" "SELECT * FROM scores LIMIT 5"

step "2. the learning demo: tiny model on the grid env, expert SFT then GRPO (recipes/quickstart.yaml)"
rm -rf runs/quickstart  # a fresh, seeded run (iterate would resume a finished one)
"$OMRL" train iterate --recipe recipes/quickstart.yaml
echo "results: runs/quickstart/results.json   report: runs/quickstart/report/report.html"
