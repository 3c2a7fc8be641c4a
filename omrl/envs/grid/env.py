"""Grid navigation: the environment of the learning demo (small, multi-turn, room for RL to beat imitation).

The agent stands on a cell of a SIZE x SIZE grid (x to the right, y downwards, 1-based) and must reach
the goal. Each observation says how far the goal lies in each direction ("goal: 3 left, 2 up"), after
a bump into the border "blocked, goal: ..."; the right move is easy to read even for a tiny model and
the observation stays a few tokens long (the whole conversation is re-read every turn, so every token
of it costs on a CPU).
Actions: one of up/down/left/right, as plain text (the move alone; default) or as the tool call `move(direction)`
(`action_format="tool"`). The step budget is the Manhattan distance + `slack` (2: one detour is allowed).

Reward (paid on the last step): 1.0 for reaching the goal in the fewest steps, 0.25 less per wasted
step (a detour costs 2 steps, a bump into the border 1), 0 when the budget runs out. An efficient
strategy therefore earns more than a merely valid one. The scripted expert moves towards the goal but
takes a random move `noise` of the time (30% by default): its demonstrations are imperfect on purpose,
so reinforcement learning has room to improve on imitation.

Tasks come from `grid_tasks(n, seed, split)` (tasks.py): deterministic, and the train and eval splits never
share a (start, goal) pair.

Walled grid (the harder task, shipped as `grid_walls_*`): a task payload may list blocked cells,
`"walls": [[x, y], ...]`. `grid_wall_tasks` puts one straight wall across every straight route from
start to goal, with a way round at one end or both. Observations then end with the walls next to the
agent ("goal: 3 up; wall: up"), and the budget and the reward count steps against the shortest path
(breadth-first search). The expert knows the whole map and walks a shortest path (with the same
`noise`); the agent sees only the walls next to it, so at a wall the expert's choice of side depends on
where the wall ends, which the agent cannot see: imitation averages over those choices and fails even
under greedy decoding (a wrong side, or a change of mind along the wall, runs out of the budget of
shortest + 2). What helps is a policy that is best for what the agent sees, its own earlier moves
included (commit to one side and follow the wall), and its decisive moves lead away from the goal and
pay off only turns later: credit assignment. Episodes of a GRPO group start from the same cell and
meet at the same wall cells (`info.state`), so step groups compare what they did there.

Every step reports the state it led to as `info["state"]`, the position "x,y" (walls are fixed per task,
so the position is the whole state): step groups of GiGPO-style credit (omrl/train/rl/step_credit.py)
and SQL (`json_extract_string(info, '$.state')` over a row's turns) read it.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.grid.tasks import best_moves, grid_tasks, grid_wall_tasks
from omrl.errors import UsageError

DIRECTIONS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
SYSTEM_PROMPT = "Reach the goal. Answer one move: up, down, left or right."
MOVE_TOOL = tool_schema(
    "move", "Move one step on the grid.",
    {"direction": {"type": "string", "enum": list(DIRECTIONS), "description": "up, down, left or right"}},
)
# A text action is the move alone (case and a final full stop tolerated): "left" is a move, "left goal" is
# not. A lenient parse would leave tokens after the move unrewarded noise that GRPO lets drift.
_MOVE = re.compile(r"\s*(up|down|left|right)\s*\.?\s*", re.IGNORECASE)


def describe(pos: tuple[int, int], goal: tuple[int, int], walls_next: list[str] | None = None) -> str:
    """The observation text: the goal's offset in words ("goal: 2 left, 3 up"), then the walls next to
    the agent when the task has walls ("goal: 3 up; wall: up, left"; nothing when none is adjacent)."""
    dx, dy = goal[0] - pos[0], goal[1] - pos[1]
    parts = []
    if dx:
        parts.append(f"{abs(dx)} {'right' if dx > 0 else 'left'}")
    if dy:
        parts.append(f"{abs(dy)} {'down' if dy > 0 else 'up'}")
    text = f"goal: {', '.join(parts) or 'here'}"
    return f"{text}; wall: {', '.join(walls_next)}" if walls_next else text


def state_key(pos: tuple[int, int]) -> str:
    """The hashable state a grid step reports as info["state"]: the position "x,y"."""
    return f"{pos[0]},{pos[1]}"


def distances_to(size: int, walls: set[tuple[int, int]], goal: tuple[int, int]) -> dict[tuple[int, int], int]:
    """The fewest moves from every reachable cell to `goal`, avoiding walls and the border (breadth-first)."""
    seen, frontier = {goal: 0}, deque([goal])
    while frontier:
        cell = frontier.popleft()
        for dx, dy in DIRECTIONS.values():
            nxt = (cell[0] + dx, cell[1] + dy)
            if 1 <= nxt[0] <= size and 1 <= nxt[1] <= size and nxt not in walls and nxt not in seen:
                seen[nxt] = seen[cell] + 1
                frontier.append(nxt)
    return seen


@dataclass
class GridOptions:
    """GridEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    action_format: Literal["text", "tool"] = "text"
    noise: float = 0.3
    seed: int | None = None
    slack: int = 2


class GridEnv:
    """Grid navigation on a small board; see the module docstring for observations, actions and rewards."""

    name = "grid"
    options_class = GridOptions
    splits = ("train", "eval")  # by a hash of the (start, goal) pair: held-out pairs are never trained on

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", size: int = 7, walls: bool = False
                       ) -> list[Task]:
        """Open grids (`grid_tasks`) or walled ones (`walls=True`, `grid_wall_tasks`)."""
        if walls:
            return grid_wall_tasks(n, seed=seed, split=split, size=int(size))
        return grid_tasks(n, seed=seed, split=split, size=int(size))

    def __init__(self, action_format: str = "text", noise: float = 0.3, seed: int | None = None, slack: int = 2
                 ) -> None:
        if action_format not in ("text", "tool"):
            raise UsageError(f"action_format must be 'text' or 'tool', got {action_format!r}")
        if int(slack) < 0:
            raise UsageError(f"slack must be 0 or more (steps beyond the shortest path), got {slack!r}")
        self.slack = int(slack)  # the step budget is the shortest path + slack (2: one detour)
        self.action_format = action_format
        self.noise = noise
        self.seed = seed
        self._resets = 0
        self._rng = random.Random(seed)
        self.pos = self.goal = (0, 0)
        self.size = 0
        self.walls: set[tuple[int, int]] = set()
        self._to_goal: dict[tuple[int, int], int] = {}  # moves left to the goal from each cell (walled tasks)
        self.steps = self.budget = self.distance = self.invalid = 0
        self.done = True

    def reset(self, task: Task) -> Reset:
        payload = task.payload
        try:
            self.size = int(payload.get("size", 7))
            self.pos = (int(payload["start"][0]), int(payload["start"][1]))
            self.goal = (int(payload["goal"][0]), int(payload["goal"][1]))
            self.walls = {(int(c[0]), int(c[1])) for c in payload.get("walls") or []}
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UsageError(f"grid task {task.id}: payload needs size, start [x, y], goal [x, y] and optional "
                             f"walls [[x, y], ...] ({exc})") from None
        self._to_goal = distances_to(self.size, self.walls, self.goal) if self.walls else {}
        distance = self._to_goal.get(self.pos) if self.walls else \
            abs(self.pos[0] - self.goal[0]) + abs(self.pos[1] - self.goal[1])
        if distance is None or self.pos in self.walls:
            raise UsageError(f"grid task {task.id}: the goal cannot be reached from the start")
        self.distance = distance
        self.budget = self.distance + self.slack
        self.steps = self.invalid = 0
        self.done = False
        # With a seed, the expert's noise depends on (seed, task, reset count) only: reproducible in any order.
        self._resets += 1
        if self.seed is not None:
            self._rng = random.Random(f"{self.seed}-{task.id}-{self._resets}")
        tools = [MOVE_TOOL] if self.action_format == "tool" else []
        prompt = SYSTEM_PROMPT if self.action_format == "text" else "Reach the goal. Call move once per step."
        return Reset(observation=self._observe(), tools=tools, system_prompt=prompt)

    def _free(self, cell: tuple[int, int]) -> bool:
        return 1 <= cell[0] <= self.size and 1 <= cell[1] <= self.size and cell not in self.walls

    def _walls_next(self) -> list[str]:
        # Only walls, not the border: the plain grid never names its border either.
        return [d for d, (dx, dy) in DIRECTIONS.items() if (self.pos[0] + dx, self.pos[1] + dy) in self.walls]

    def _observe(self) -> str:
        return describe(self.pos, self.goal, self._walls_next() if self.walls else None)

    def _direction(self, action: Action) -> str | None:
        if action.tool is not None:
            if action.tool != "move" or not isinstance(action.arguments, dict):
                return None
            value = str(action.arguments.get("direction", "")).strip().lower()
            return value if value in DIRECTIONS else None
        match = _MOVE.fullmatch(action.text or "")
        return match.group(1).lower() if match else None

    def step(self, action: Action) -> StepResult:
        if self.done:
            return StepResult("the episode is over", 0.0, True,
                              {"invalid_action": True, "success": False, "state": state_key(self.pos)})
        self.steps += 1
        direction = self._direction(action)
        info: dict[str, Any] = {}
        if direction is None:
            self.invalid += 1
            info["invalid_action"] = True
            what = "invalid action"
        else:
            dx, dy = DIRECTIONS[direction]
            if self._free((self.pos[0] + dx, self.pos[1] + dy)):
                self.pos = (self.pos[0] + dx, self.pos[1] + dy)
                what = ""
            else:
                self.invalid += 1
                info["invalid_action"] = True
                what = "blocked"
        info["state"] = state_key(self.pos)
        reached = self.pos == self.goal
        left = self.budget - self.steps
        if reached or left <= 0:
            self.done = True
            wasted = self.steps - self.distance
            reward = max(0.0, 1.0 - 0.25 * wasted) if reached else 0.0
            info.update(success=reached, steps=self.steps, distance=self.distance, invalid=self.invalid)
            end = "reached the goal" if reached else "out of steps"
            return StepResult(f"{what}, {end}" if what else end, reward, True, info)
        observation = self._observe()
        return StepResult(f"{what}, {observation}" if what else observation, 0.0, False, info)

    def expert_action(self) -> Action:
        """A move towards the goal, or a random one `noise` of the time (imperfect demonstrations); with
        walls, a move along a shortest path (the expert knows the map; the agent sees adjacent walls only)."""
        if self._rng.random() < self.noise:
            direction = self._rng.choice(list(DIRECTIONS))
        elif self.walls:
            here = self._to_goal.get(self.pos, 0)
            closer = [d for d, (dx, dy) in DIRECTIONS.items()
                      if self._to_goal.get((self.pos[0] + dx, self.pos[1] + dy), here) == here - 1]
            direction = self._rng.choice(closer or list(DIRECTIONS))
        else:
            direction = self._rng.choice(best_moves(self.pos, self.goal) or list(DIRECTIONS))
        if self.action_format == "tool":
            return Action(tool="move", arguments={"direction": direction})
        return Action(text=direction)

    def close(self) -> None:
        self.done = True


