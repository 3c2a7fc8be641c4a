#!/usr/bin/env bash
# The demo chain on built-in defaults: build a store from the shipped samples, then look at it.
set -euo pipefail
cd "$(dirname "$0")/.."
OMRL=".venv/bin/omrl"
STORE="demo-store"
rm -rf "$STORE"
"$OMRL" store append "$STORE" datasets/samples/*.jsonl
"$OMRL" stats "$STORE"
ID=$("$OMRL" query "$STORE" "SELECT id FROM trajectories WHERE success ORDER BY id LIMIT 1" --format csv | tail -1 | tr -d '"')
"$OMRL" show "$STORE" "$ID"
"$OMRL" query "$STORE" "SELECT env, count(*) AS n, avg(reward) AS mean_reward FROM trajectories GROUP BY env ORDER BY env"
"$OMRL" query "$STORE" "SELECT name, count(*) AS calls FROM tool_calls GROUP BY name ORDER BY calls DESC"
"$OMRL" query "$STORE" "SELECT task_id, n, mean_reward, std_reward, success_rate FROM groups ORDER BY std_reward DESC LIMIT 5"
