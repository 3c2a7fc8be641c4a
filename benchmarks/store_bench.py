"""Store vs JSONL: bytes on disk, write time and four analytic queries on a realistic synthetic corpus.

Corpus: N trajectories, about 8 turns on average, a repeated 1.5 KB system prompt, tool outputs of
0.2-4 KB. Samples of one task (a GRPO group) read many of the same files, as agents in one repository do,
so each task has a pool of documents its tool calls return; the rest of the outputs are fresh text.

Prints one JSON line; targets: size_ratio (JSONL bytes / store bytes) >= 10,
query_speedup_min (smallest JSONL-time / store-time over the four queries) >= 20.

    python benchmarks/store_bench.py --n 100000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from omrl.schema import group_id, to_table, trajectory_id
from omrl.store import Store

ENVS = ("code", "math", "shop", "sql", "web")
TOOLS = {
    "code": ["list_files", "read_file", "edit_file", "run_tests"],
    "math": ["calculator", "python"],
    "shop": ["search", "click", "view"],
    "sql": ["execute_sql", "describe_table"],
    "web": ["open_url", "find", "scroll"],
}
SEARCH_WORD = "segfault"  # appears in a known share of tool outputs


def make_vocabulary(rng: random.Random, size: int = 4000) -> tuple[list[str], list[float]]:
    """Pseudo-words with Zipf frequencies, like identifiers and prose in real tool output."""
    letters = "etaoinshrdlcumwfgypbvkjxqz_"
    words = sorted({"".join(rng.choices(letters, k=rng.randint(2, 11))) for _ in range(size)})
    weights = [1 / (rank + 1) for rank in range(len(words))]
    return words, weights


class TextSource:
    """Fresh text: random slices of a large Zipf-word corpus (no two slices alike within a page)."""

    def __init__(self, rng: random.Random, megabytes: int = 24):
        words, weights = make_vocabulary(rng)
        lines = []
        size = 0
        while size < megabytes * 1_000_000:
            line = " ".join(rng.choices(words, weights, k=rng.randint(3, 14)))
            lines.append(line)
            size += len(line) + 1
        self.corpus = "\n".join(lines)
        self.rng = rng

    def text(self, n_bytes: int) -> str:
        start = self.rng.randrange(0, len(self.corpus) - n_bytes - 1)
        return self.corpus[start:start + n_bytes]


SYSTEM_PROMPT = ("You are a capable software agent working inside a sandbox. Use the tools provided to inspect "
                 "the environment, reason about what you observe, and act. Keep each tool call focused, never "
                 "invent observations, prefer small verifiable steps, and stop when the task is complete. ") * 6
SYSTEM_PROMPT = SYSTEM_PROMPT[:1500]


def make_corpus(n: int, seed: int, samples_per_task: int = 8):
    """Yield n trajectory rows (dicts) with the shape described in the module docstring."""
    rng = random.Random(seed)
    source = TextSource(rng)
    pools: dict[str, list[str]] = {}
    for index in range(n):
        task_number = index // samples_per_task
        env = ENVS[task_number % len(ENVS)]
        task_id = f"{env}-{task_number:07d}"
        sample = index % samples_per_task
        if sample == 0:
            pools = {task_id: [source.text(rng.randint(200, 4000)) for _ in range(6)]}
            instruction = source.text(rng.randint(150, 500))
        n_turns = max(1, min(40, round(rng.lognormvariate(1.9, 0.5))))
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]
        turns = []
        for turn in range(n_turns):
            tool = rng.choice(TOOLS[env])
            call_id = f"call_{turn}"
            output = rng.choice(pools[task_id]) if rng.random() < 0.6 else source.text(rng.randint(200, 4000))
            if rng.random() < 0.02:
                output = output[: len(output) // 2] + f" {SEARCH_WORD} " + output[len(output) // 2:]
            messages.append({"role": "assistant", "content": source.text(rng.randint(40, 300)),
                             "tool_calls": [{"id": call_id, "name": tool,
                                             "arguments": json.dumps({"arg": source.text(rng.randint(10, 60))})}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "name": tool, "content": output})
            turns.append({"index": turn, "reward": 0.0, "done": turn == n_turns - 1,
                          "latency_s": round(rng.uniform(0.3, 4.0), 3), "prompt_tokens": 500 + 350 * turn,
                          "completion_tokens": rng.randint(20, 150), "info": "{}"})
        success = rng.random() < 0.4
        turns[-1]["reward"] = 1.0 if success else 0.0
        run_id = "bench"
        yield {
            "id": trajectory_id(run_id, 0, task_id, sample), "run_id": run_id, "round": 0, "task_id": task_id,
            "group_id": group_id(run_id, 0, task_id), "sample": sample, "env": env, "model": "bench-policy",
            "instruction": instruction, "task": json.dumps({"answer": str(task_number)}), "tools": "[]",
            "messages": messages, "turns": turns, "reward": 1.0 if success else 0.0, "success": success,
            "status": "ok", "num_turns": n_turns,
            "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
            "completion_tokens": sum(t["completion_tokens"] for t in turns),
            "duration_s": round(sum(t["latency_s"] for t in turns), 3), "source": "collected",
            "metadata": "{}", "created_at": "2026-01-01T00:00:00+00:00",
        }


# ------------------------------------------------------------------ JSONL baseline (plain Python)

def _jsonl_rows(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def jsonl_success_per_env(path: Path) -> dict:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in _jsonl_rows(path):
        counts[row["env"]][0] += bool(row["success"])
        counts[row["env"]][1] += 1
    return {env: ok / n for env, (ok, n) in counts.items()}


def jsonl_groups(path: Path) -> dict:
    rewards: dict[str, list[float]] = defaultdict(list)
    for row in _jsonl_rows(path):
        rewards[row["group_id"]].append(row["reward"])
    return {g: (len(r), statistics.fmean(r), statistics.pstdev(r)) for g, r in rewards.items()}


def jsonl_tool_counts(path: Path) -> Counter:
    counts: Counter = Counter()
    for row in _jsonl_rows(path):
        for message in row["messages"]:
            for call in message.get("tool_calls") or []:
                counts[call["name"]] += 1
    return counts


def jsonl_word_search(path: Path, word: str) -> int:
    return sum(any(word in (m.get("content") or "") for m in row["messages"]) for row in _jsonl_rows(path))


STORE_QUERIES = {
    "success_per_env": "SELECT env, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS rate FROM trajectories GROUP BY env",
    "groups": "SELECT group_id, n, mean_reward, std_reward FROM groups",
    "tool_counts": "SELECT name, count(*) AS n FROM tool_calls GROUP BY name",
    "word_search": f"SELECT count(*) AS n FROM trajectories "
                   f"WHERE len(list_filter(messages, lambda m: contains(m.content, '{SEARCH_WORD}'))) > 0",
}


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="trajectories in the corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--batch", type=int, default=5000, help="rows per store append")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="omrl-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl_path, store_path = workdir / "corpus.jsonl", workdir / "store"
    shutil.rmtree(store_path, ignore_errors=True)

    rows = list(make_corpus(args.n, args.seed))  # generated once, outside the timed writes

    start = time.perf_counter()
    with open(jsonl_path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    jsonl_write_s = time.perf_counter() - start

    start = time.perf_counter()
    store = Store.create(store_path)
    for i in range(0, len(rows), args.batch):
        store.append(to_table(rows[i:i + args.batch]))
    store.compact()
    store_write_s = time.perf_counter() - start
    del rows

    jsonl_bytes = jsonl_path.stat().st_size
    store_bytes = sum(p.stat().st_size for p in store_path.rglob("*") if p.is_file())

    con = store.connect()
    baselines = {
        "success_per_env": (jsonl_success_per_env, jsonl_path),
        "groups": (jsonl_groups, jsonl_path),
        "tool_counts": (jsonl_tool_counts, jsonl_path),
        "word_search": (lambda p: jsonl_word_search(p, SEARCH_WORD), jsonl_path),
    }
    query_times = {}
    for name, sql in STORE_QUERIES.items():
        store_s, result = timed(lambda q=sql: con.sql(q).to_arrow_table())
        jsonl_s, expected = timed(*baselines[name])
        if name == "word_search":  # both sides must agree, or the timing means nothing
            assert result.column("n")[0].as_py() == expected, (result, expected)
        elif name == "tool_counts":
            assert dict(zip(result.column("name").to_pylist(), result.column("n").to_pylist(), strict=True)) == dict(expected)
        else:
            assert result.num_rows == len(expected)
        query_times[name] = {"store_s": round(store_s, 4), "jsonl_s": round(jsonl_s, 3),
                             "speedup": round(jsonl_s / store_s, 1)}

    print(json.dumps({
        "n": args.n,
        "jsonl_bytes": jsonl_bytes,
        "store_bytes": store_bytes,
        "size_ratio": round(jsonl_bytes / store_bytes, 2),
        "jsonl_write_s": round(jsonl_write_s, 2),
        "store_write_s": round(store_write_s, 2),
        "queries": query_times,
        "query_speedup_min": min(q["speedup"] for q in query_times.values()),
    }))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
