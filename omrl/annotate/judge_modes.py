"""The judge modes omrl ships (registered in omrl.annotate.judge.JUDGE_MODES), one class each: which
trajectories it judges together, its prompt, the check of a reply and how the replies become annotation rows.

  pointwise  one call per trajectory; the rubric's scale; annotator "judge:<rubric>".
  pairwise   every pair of trajectories of the same task, asked in both orders (A/B and B/A) to cancel
             position bias; a pair's score for x is the mean of its two outcomes (win 1, tie 0.5, loss 0);
             a trajectory's score is its mean over its pairs (a win rate in [0, 1]);
             annotator "judge:<rubric>:pairwise". A trajectory alone in its task is skipped (counted).
  group      all samples of one group_id in one call, scored relative to each other (as ART's RULER);
             annotator "judge:<rubric>:group"; tokens and cost are split evenly over the group.

A prompt is rendered into the judge's prompt budget (render.py elides); a group larger than `group_max` is
scored in chunks of at most that many members; a prompt that cannot fit is an error annotation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from omrl.annotate.cache import prompt_hash
from omrl.annotate.judge import (
    REASK_ROOM_TOKENS,
    Answer,
    Judge,
    JudgeConfig,
    JudgeMode,
    Progress,
    chars,
    parse_json_reply,
    reply_number,
)
from omrl.annotate.render import render_trajectory
from omrl.annotate.rubric import Rubric
from omrl.errors import UsageError
from omrl.schema.rows import TrajectoryRow, UncheckedRow

MIN_RENDER_CHARS = 200  # below this a trajectory rendering says nothing: refuse instead


def _render(config: JudgeConfig, row: TrajectoryRow, budget: int | None = None) -> str:
    return render_trajectory(row, max_chars=budget or config.max_chars, keep_last=config.keep_last)


def render_budget(config: JudgeConfig, frame: list[dict[str, Any]], n: int, default: int) -> int:
    """Characters each of `n` trajectories may take in a prompt whose other text is `frame` (the messages
    built with empty renderings): `default`, lowered to what the judge's prompt budget leaves."""
    total = config.promptchars()
    if total is None:
        return default
    room = total - chars(frame) - int(REASK_ROOM_TOKENS * config.chars_per_token) - 40 * n
    return min(default, room // n)


def _too_small(budget: int, n: int) -> str:
    return (f"the judge's max_prompt_tokens leaves {max(budget, 0)} characters per trajectory for {n} "
            f"trajectorie(s), under {MIN_RENDER_CHARS}: raise max_prompt_tokens or lower group_max")


def chunks(members: list[Any], size: int | None) -> list[list[Any]]:
    """`members` split into balanced chunks of at most `size` (one chunk when size is None or enough)."""
    if size is None or len(members) <= size:
        return [members]
    k = math.ceil(len(members) / size)
    step = len(members) / k
    return [members[round(i * step):round((i + 1) * step)] for i in range(k)]


class Pointwise(JudgeMode):
    """One call per trajectory, scored on the rubric's scale."""

    name = "pointwise"
    _FORMAT = ('Reply with JSON only: {{"score": <number from {lo:g} to {hi:g}>, '
               '"rationale": "<one or two sentences>"}}')

    def annotator(self, rubric: Rubric) -> str:
        return rubric.annotator

    def messages(self, rubric: Rubric, rendering: str) -> list[dict[str, Any]]:
        system = ("You are a strict judge of AI agent trajectories.\n" + rubric.describe() + "\n"
                  + self._FORMAT.format(lo=rubric.scale_min, hi=rubric.scale_max))
        messages = [{"role": "system", "content": system}]
        for ex in rubric.examples:
            messages.append({"role": "user", "content": f"Trajectory:\n{ex.trajectory}"})
            messages.append({"role": "assistant",
                             "content": json.dumps({"score": ex.score, "rationale": ex.rationale})})
        messages.append({"role": "user", "content": f"Trajectory:\n{rendering}"})
        return messages

    @staticmethod
    def validate(rubric: Rubric) -> Callable[[str], dict[str, Any]]:
        def check(text: str) -> dict[str, Any]:
            data = parse_json_reply(text)
            if "score" not in data:
                raise UsageError('the JSON has no "score"')
            score = reply_number(data["score"], "score")
            if not rubric.in_range(score):
                raise UsageError(f"score {score:g} is outside the scale {rubric.scale_min:g}..{rubric.scale_max:g}")
            return {"score": score, "rationale": str(data.get("rationale") or "")}
        return check

    async def judge(self, judge: Judge, rows: list[TrajectoryRow], run_id: str,
                    progress: Progress = lambda n: None) -> list[UncheckedRow]:
        cfg = judge.config
        check = self.validate(cfg.rubric)

        budget = render_budget(cfg, self.messages(cfg.rubric, ""), 1, cfg.max_chars)

        async def one(row: TrajectoryRow) -> UncheckedRow:
            if budget < MIN_RENDER_CHARS:
                progress(1)
                return self.row(cfg, row["id"], run_id, None, error=_too_small(budget, 1),
                                metadata={"mode": "pointwise"})
            answer = await judge.ask(self.messages(cfg.rubric, _render(cfg, row, budget)), check)
            progress(1)
            meta = {"mode": "pointwise", "cached": answer.cached, "attempts": answer.attempts}
            if answer.error:
                return self.row(cfg, row["id"], run_id, answer, error=answer.error, metadata=meta)
            return self.row(cfg, row["id"], run_id, answer, score=answer.value["score"],
                            rationale=answer.value["rationale"], metadata=meta)

        return list(await asyncio.gather(*(one(r) for r in rows)))


def _pair_outcome(preference: str, x_is: str) -> float:
    if preference == "TIE":
        return 0.5
    return 1.0 if preference == x_is else 0.0


class Pairwise(JudgeMode):
    """Every pair of one task's trajectories, asked in both orders; each trajectory's score is its win rate."""

    name = "pairwise"
    together = "task_id"
    kind = "pairwise"

    def messages(self, rubric: Rubric, first: str, second: str) -> list[dict[str, Any]]:
        system = ("You compare two AI agent trajectories that attempt the same task.\n" + rubric.describe() + "\n"
                  'Reply with JSON only: {"preference": "A" | "B" | "tie", "rationale": "<one or two sentences>"}')
        user = f"TRAJECTORY A:\n{first}\n\nTRAJECTORY B:\n{second}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    @staticmethod
    def validate(text: str) -> dict[str, Any]:
        data = parse_json_reply(text)
        pref = str(data.get("preference", "")).strip().upper()
        if pref not in ("A", "B", "TIE"):
            raise UsageError(f'"preference" must be "A", "B" or "tie", got {data.get("preference")!r}')
        return {"preference": pref, "rationale": str(data.get("rationale") or "")}

    async def judge(self, judge: Judge, rows: list[TrajectoryRow], run_id: str,
                    progress: Progress = lambda n: None) -> list[UncheckedRow]:
        cfg = judge.config
        by_task = self.sets(rows)
        budget = max(MIN_RENDER_CHARS, render_budget(cfg, self.messages(cfg.rubric, "", ""), 2, cfg.max_chars))
        renders = {r["id"]: _render(cfg, r, budget) for r in rows}  # an over-budget pair is refused by ask()
        pairs = [(a, b) for group in by_task.values() for a, b in itertools.combinations(group, 2)]
        singles = [g[0] for g in by_task.values() if len(g) == 1]
        judge.stats.skipped += len(singles)
        progress(len(singles))

        async def both_orders(a: TrajectoryRow, b: TrajectoryRow) -> tuple[Answer, Answer]:
            ab, ba = await asyncio.gather(
                judge.ask(self.messages(cfg.rubric, renders[a["id"]], renders[b["id"]]), self.validate),
                judge.ask(self.messages(cfg.rubric, renders[b["id"]], renders[a["id"]]), self.validate))
            return ab, ba

        results = await asyncio.gather(*(both_orders(a, b) for a, b in pairs))
        per: dict[str, dict[str, Any]] = defaultdict(lambda: {"outcomes": [], "errors": [], "hashes": [],
                                                              "pt": 0, "ct": 0, "inconsistent": 0, "cached": 0})
        for (a, b), (ab, ba) in zip(pairs, results, strict=True):
            for tid in (a["id"], b["id"]):
                acc = per[tid]
                for ans in (ab, ba):  # each call serves two trajectories: charge half to each
                    acc["pt"] += ans.prompt_tokens / 2
                    acc["ct"] += ans.completion_tokens / 2
                    acc["hashes"].append(ans.prompt_hash)
                    acc["cached"] += ans.cached
            if ab.error or ba.error:
                for tid in (a["id"], b["id"]):
                    per[tid]["errors"].append(ab.error or ba.error)
                continue
            x_first = _pair_outcome(ab.value["preference"], "A")
            x_second = _pair_outcome(ba.value["preference"], "B")
            if x_first != x_second:
                per[a["id"]]["inconsistent"] += 1
                per[b["id"]]["inconsistent"] += 1
            x = (x_first + x_second) / 2
            per[a["id"]]["outcomes"].append(x)
            per[b["id"]]["outcomes"].append(1.0 - x)

        out = []
        for tid, acc in per.items():
            answer = Answer(prompt_hash=prompt_hash(cfg.model, [{"pairs": sorted(acc["hashes"])}], cfg.temperature),
                            prompt_tokens=round(acc["pt"]), completion_tokens=round(acc["ct"]))
            meta = {"mode": "pairwise", "pairs": len(acc["outcomes"]), "failed_pairs": len(acc["errors"]),
                    "position_inconsistent": acc["inconsistent"], "cached_calls": acc["cached"]}
            progress(1)
            if not acc["outcomes"]:
                out.append(self.row(cfg, tid, run_id, answer, error=f"every pair failed: {acc['errors'][0]}",
                                    metadata=meta))
                continue
            win_rate = sum(acc["outcomes"]) / len(acc["outcomes"])
            out.append(self.row(cfg, tid, run_id, answer, score=win_rate, label=None,
                                rationale=f"win rate {win_rate:.3f} over {len(acc['outcomes'])} pair(s), both orders",
                                metadata=meta))
        return out


class Group(JudgeMode):
    """One call per group_id, its samples scored relative to each other (in chunks above group_max)."""

    name = "group"
    together = "group_id"

    def messages(self, rubric: Rubric, renderings: list[str]) -> list[dict[str, Any]]:
        n = len(renderings)
        system = (f"You compare {n} AI agent trajectories that attempt the same task, scoring each relative to "
                  "the others (better trajectories get higher scores).\n" + rubric.describe() + "\n"
                  'Reply with JSON only: {"scores": [{"id": <1..' + str(n) + '>, "score": <number>, '
                  '"rationale": "<short>"}, ...]} with one entry per trajectory.')
        user = "\n\n".join(f"=== TRAJECTORY {i} ===\n{r}" for i, r in enumerate(renderings, 1))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    @staticmethod
    def validate(rubric: Rubric, n: int) -> Callable[[str], dict[int, dict[str, Any]]]:
        def check(text: str) -> dict[int, dict[str, Any]]:
            data = parse_json_reply(text)
            items = data.get("scores")
            if not isinstance(items, list):
                raise UsageError('the JSON has no "scores" list')
            out: dict[int, dict[str, Any]] = {}
            for item in items:
                if not isinstance(item, dict) or "id" not in item or "score" not in item:
                    raise UsageError('each entry of "scores" needs "id" and "score"')
                idx = int(reply_number(item["id"], "id"))
                score = reply_number(item["score"], f"score of trajectory {idx}")
                if not rubric.in_range(score):
                    raise UsageError(f"score {score:g} of trajectory {idx} is outside the scale "
                                     f"{rubric.scale_min:g}..{rubric.scale_max:g}")
                out[idx] = {"score": score, "rationale": str(item.get("rationale") or "")}
            if sorted(out) != list(range(1, n + 1)):
                raise UsageError(f"expected one score for each trajectory id 1..{n}, got ids {sorted(out)}")
            return out
        return check

    async def judge(self, judge: Judge, rows: list[TrajectoryRow], run_id: str,
                    progress: Progress = lambda n: None) -> list[UncheckedRow]:
        cfg = judge.config
        groups = self.sets(rows)

        async def one(members: list[TrajectoryRow], chunk: int, of: int, size: int) -> list[UncheckedRow]:
            n = len(members)
            # Without a prompt budget, the historic per-member floor; with one, what the budget leaves.
            default = max(1500, cfg.max_chars // n) if cfg.max_prompt_tokens is None else cfg.max_chars // n
            budget = render_budget(cfg, self.messages(cfg.rubric, [""] * n), n, default)
            meta = {"mode": "group", "group_size": size, **({"chunk": chunk, "chunks": of} if of > 1 else {})}
            if budget < MIN_RENDER_CHARS:
                progress(n)
                return [self.row(cfg, row["id"], run_id, None, error=_too_small(budget, n), metadata=meta)
                        for row in members]
            answer = await judge.ask(self.messages(cfg.rubric, [_render(cfg, r, budget) for r in members]),
                                     self.validate(cfg.rubric, n))
            progress(n)
            share = Answer(prompt_hash=answer.prompt_hash, prompt_tokens=round(answer.prompt_tokens / n),
                           completion_tokens=round(answer.completion_tokens / n))
            out = []
            for i, row in enumerate(members, 1):
                row_meta = {**meta, "position": i, "cached": answer.cached, "attempts": answer.attempts}
                if answer.error:
                    out.append(self.row(cfg, row["id"], run_id, share, error=answer.error, metadata=row_meta))
                else:
                    v = answer.value[i]
                    out.append(self.row(cfg, row["id"], run_id, share, score=v["score"], rationale=v["rationale"],
                                        metadata=row_meta))
            return out

        jobs = []
        for members in groups.values():
            members = sorted(members, key=lambda r: (r.get("sample") or 0, r["id"]))
            parts = chunks(members, cfg.group_max)
            jobs += [one(part, i, len(parts), len(members)) for i, part in enumerate(parts, 1)]
        results = await asyncio.gather(*jobs)
        return [r for rs in results for r in rs]
