"""Online rewards: a reward recipe's metrics and judges score rollouts while the other groups still play.

    online = OnlineReward("recipes/reward.yaml", store.cache_dir("judge"))   # the judge reply cache
    step = online.step(step=0, round=1, expected={"t1": 8, "t2": 8})
    episodes = await play_episodes(jobs, ..., on_episode=step.on_episode)
    scored = await step.finish()          # one StepRewards: reward per trajectory, annotations, counts

- A group (the episodes of one task in the step) is scored the moment its last episode finishes: metrics
  (omrl.annotate.metrics.annotate_row) and every judge of the recipe (omrl.annotate.judge's modes, the
  same client, cache by prompt hash, retries and concurrency limit as `omrl annotate`) run as an asyncio
  task beside the episodes still in flight.
- The reward is omrl.annotate.reward.combine, the one combiner of `omrl annotate`: a component whose
  metric or judge failed (or did not apply) is missing, never 0; the recipe's `missing` policy
  renormalises over the present components or leaves the reward None (the sample is dropped: TRL leaves
  it out of its group's baseline).
- Every score is an annotation row (annotator, rubric, judge model, rationale, tokens, cost, run id of
  the rollout) with {"grpo_step", "grpo_round"} in its metadata, plus one row of the combined reward per
  rollout (an error row naming what was missing when there is none); the caller appends them.
- Failed episodes (env or model errors) are not scored: their reward is None and they count as failed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.annotate.cache import JudgeCache
from omrl.annotate.judge import Judge, JudgeStats, judge_rows
from omrl.annotate.metrics import annotate_row
from omrl.annotate.reward import ENV_REWARD, RewardRecipe, combine, load_reward_recipe, reward_annotations
from omrl.annotate.runner import check_computable, recipe_judges, recipe_metrics
from omrl.errors import UsageError
from omrl.schema import is_failed
from omrl.schema.rows import TrajectoryRow, UncheckedRow


@dataclass
class StepRewards:
    """What scoring one step's rollouts gave."""

    step: int
    rewards: dict[str, float | None] = field(default_factory=dict)  # trajectory id -> combined reward
    annotations: list[dict[str, Any]] = field(default_factory=list)  # to append to the store
    missing: Counter = field(default_factory=Counter)  # component -> scored rollouts lacking it
    dropped: int = 0  # scored rollouts left without a reward (missing: null, or nothing present)
    failed: int = 0  # failed episodes: not scored
    first_error: str | None = None  # the first failed component's error, for a step that cannot train

    def log_entry(self) -> dict[str, Any]:
        """The step's counts as stored in omrl_grpo.json."""
        return {"step": self.step, "scored": len(self.rewards) - self.failed, "dropped": self.dropped,
                "failed": self.failed, "missing": dict(sorted(self.missing.items())),
                **({"first_error": self.first_error} if self.first_error else {})}


def _with_meta(annotation: UncheckedRow, extra: Mapping[str, Any]) -> dict[str, Any]:
    meta = annotation.get("metadata")
    return {**annotation, "metadata": {**(meta if isinstance(meta, dict) else {}), **extra}}


class OnlineReward:
    """A reward recipe made ready to score rollouts online (see the module docstring)."""

    def __init__(self, recipe: str | Path | dict[str, Any] | RewardRecipe, cache_dir: str | Path | None):
        self.recipe = load_reward_recipe(recipe)
        self.metrics = recipe_metrics(self.recipe)
        self.judges = recipe_judges(self.recipe)
        check_computable(self.recipe, self.metrics, self.judges)
        self.cache = JudgeCache(cache_dir)  # the folder `omrl annotate` uses: STORE/cache/judge
        self.judge_stats = {j.annotator: JudgeStats() for j in self.judges}
        self.judge_cost = Counter()  # annotator -> USD of live calls
        self.steps: list[dict[str, Any]] = []

    def step(self, step: int, round: int, expected: Mapping[str, int]) -> StepScoring:
        """Scoring for one step whose task ids come `expected[task]` times; use it in one event loop."""
        return StepScoring(self, step, round, expected)

    def record(self, scored: StepRewards) -> None:
        self.steps.append(scored.log_entry())

    def summary(self) -> dict[str, Any]:
        """Totals over the run: missing per component, dropped and failed rollouts, judge calls and cost."""
        missing: Counter = Counter()
        for s in self.steps:
            missing.update(s["missing"])
        judges = {}
        for name, st in self.judge_stats.items():
            judges[name] = {"calls": st.calls, "cache_hits": st.cache_hits, "transport_retries": st.transport_retries,
                            "invalid_replies": st.invalid_replies, "prompt_tokens": st.prompt_tokens,
                            "completion_tokens": st.completion_tokens,
                            "cost_usd": round(self.judge_cost[name], 6) if name in self.judge_cost else None}
        return {"recipe": self.recipe.to_dict(), "source": self.recipe.source, "steps": len(self.steps),
                "scored": sum(s["scored"] for s in self.steps), "dropped": sum(s["dropped"] for s in self.steps),
                "failed": sum(s["failed"] for s in self.steps), "missing": dict(sorted(missing.items())),
                "judges": judges}


class StepScoring:
    """Scores each group of one step as it completes; `finish` waits for the groups still being scored."""

    def __init__(self, online: OnlineReward, step: int, round: int, expected: Mapping[str, int]):
        self.online, self.step_no, self.round = online, step, round
        self.expected = dict(expected)
        self.meta = {"grpo_step": step, "grpo_round": round}
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.running: list[asyncio.Task] = []
        self.result = StepRewards(step)
        self._judges: list[Judge] | None = None

    def _judges_here(self) -> list[Judge]:
        # Made inside the running loop: the LLM client's connections belong to it.
        if self._judges is None:
            self._judges = [Judge(cfg, self.online.cache) for cfg in self.online.judges]
        return self._judges

    def on_episode(self, episode: Any) -> None:
        """play_episodes' callback: a group whose last episode this is starts being scored now."""
        row = episode.row
        task = row["task_id"]
        if task not in self.expected:
            raise UsageError(f"episode of task {task!r}, which the step did not ask for")
        group = self.pending.setdefault(task, [])
        group.append(row)
        if len(group) == self.expected[task]:
            del self.pending[task]
            self.running.append(asyncio.get_running_loop().create_task(self._score(group)))

    async def _score(self, rows: list[TrajectoryRow]) -> None:
        live = [r for r in rows if not is_failed(r["status"])]
        out = self.result
        for r in rows:
            if is_failed(r["status"]):
                out.failed += 1
                out.rewards[r["id"]] = None
        if not live:
            return
        run_id = live[0]["run_id"]
        annotations: list[dict[str, Any]] = []
        for row in live:
            metric_rows, _skipped = annotate_row(row, self.online.metrics, run_id)  # skipped = missing
            annotations += metric_rows
        judged = await asyncio.gather(*(judge_rows(j, live, run_id) for j in self._judges_here()))
        for rows_out in judged:
            annotations += rows_out
        scores: dict[str, dict[str, float]] = {r["id"]: {} for r in live}
        for a in annotations:
            if a.get("status") == "ok" and a.get("score") is not None:
                scores[a["trajectory_id"]][a["annotator"]] = a["score"]
            elif a.get("status") == "error" and out.first_error is None:
                out.first_error = f"{a['annotator']}: {a.get('error')}"
            if a.get("cost_usd") is not None and not (a.get("metadata") or {}).get("cached"):
                self.online.judge_cost[a["annotator"]] += a["cost_usd"]
        recipe = self.online.recipe
        combined = []
        for row in live:
            reward, absent = combine(recipe, {ENV_REWARD: row["reward"], **scores[row["id"]]})
            out.rewards[row["id"]] = reward
            out.missing.update(absent)
            out.dropped += reward is None
            combined.append({"trajectory_id": row["id"], "reward": reward, "missing": ",".join(absent)})
        annotations += reward_annotations(combined, recipe, run_id)  # as `omrl annotate --reward-recipe` writes
        out.annotations += [_with_meta(a, self.meta) for a in annotations]

    async def cancel(self) -> None:
        """Stop the groups still being scored (the step failed) and close the judges' connections."""
        for task in self.running:
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        for judge in self._judges or []:
            await judge.close()

    async def finish(self) -> StepRewards:
        """Wait for every group's scores; a group left incomplete (fewer episodes came back) is scored as is."""
        for rows in list(self.pending.values()):
            self.running.append(asyncio.get_running_loop().create_task(self._score(rows)))
        self.pending.clear()
        try:
            await asyncio.gather(*self.running)
        finally:
            for judge in self._judges or []:
                stats = self.online.judge_stats[judge.config.annotator]
                for name in ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "transport_retries",
                             "invalid_replies", "skipped"):
                    setattr(stats, name, getattr(stats, name) + getattr(judge.stats, name))
                await judge.close()
        self.online.record(self.result)
        return self.result
