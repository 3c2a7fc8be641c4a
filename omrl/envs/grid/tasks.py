"""Grid tasks: open boards (`grid_tasks`) and walled ones (`grid_wall_tasks`), deterministic, split by a hash
of the (start, goal) pair so train and eval never share one (the game itself is in env.py)."""

from __future__ import annotations

import hashlib
import random

from omrl.envs.base import Task
from omrl.errors import UsageError


def best_moves(pos: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    """The moves that bring `pos` one step closer to `goal`."""
    moves = []
    if goal[0] != pos[0]:
        moves.append("right" if goal[0] > pos[0] else "left")
    if goal[1] != pos[1]:
        moves.append("down" if goal[1] > pos[1] else "up")
    return moves


def _split_of(start: tuple[int, int], goal: tuple[int, int]) -> str:
    # A hash of the pair, not the draw order, decides the split: held-out pairs are never trained on.
    digest = hashlib.sha256(f"{start}{goal}".encode()).digest()
    return "eval" if digest[0] % 5 == 0 else "train"


def grid_tasks(n: int, seed: int = 0, split: str = "train", size: int = 7, min_distance: int = 2
               ) -> list[Task]:
    """`n` distinct grid tasks of one split ("train" or "eval"), the same for the same arguments."""
    if split not in ("train", "eval"):
        raise UsageError(f"split must be 'train' or 'eval', got {split!r}")
    pairs = [((sx, sy), (gx, gy))
             for sx in range(1, size + 1) for sy in range(1, size + 1)
             for gx in range(1, size + 1) for gy in range(1, size + 1)
             if abs(sx - gx) + abs(sy - gy) >= min_distance]
    pairs = [p for p in pairs if _split_of(*p) == split]
    if n > len(pairs):
        raise UsageError(f"only {len(pairs)} distinct {split} tasks exist on a {size}x{size} grid, asked for {n}")
    random.Random(f"{seed}-{split}").shuffle(pairs)
    tasks = []
    for start, goal in pairs[:n]:
        task_id = f"grid-{size}-{start[0]}{start[1]}-{goal[0]}{goal[1]}"
        tasks.append(Task(id=task_id, instruction=f"Reach the goal on a {size}x{size} grid.", env="grid",
                          split=split, answer=" ".join(best_moves(start, goal)),
                          payload={"size": size, "start": list(start), "goal": list(goal)}))
    return tasks


def _wall_between(start: tuple[int, int], goal: tuple[int, int], size: int) -> list[list[int]]:
    # One straight wall across the major axis of the move, strictly between start and goal, covering
    # both of their cross coordinates (every straight route is blocked) and stretched 0-2 cells further
    # each way, seeded by the pair only, so the same pair always has the same wall. At least one
    # end stays open: the goal is always reachable.
    rng = random.Random(f"walls-{start}-{goal}")
    vertical_move = abs(goal[1] - start[1]) >= abs(goal[0] - start[0])
    along, across = (1, 0) if vertical_move else (0, 1)
    line = rng.randint(min(start[along], goal[along]) + 1, max(start[along], goal[along]) - 1)
    lo = max(1, min(start[across], goal[across]) - rng.randint(0, 2))
    hi = min(size, max(start[across], goal[across]) + rng.randint(0, 2))
    if lo == 1 and hi == size:  # no way round: give back one end's stretch (callers skip pairs spanning the board)
        if min(start[across], goal[across]) > 1 and (max(start[across], goal[across]) == size or rng.random() < 0.5):
            lo = min(start[across], goal[across])
        else:
            hi = max(start[across], goal[across])
    cells = []
    for c in range(lo, hi + 1):
        cell = [0, 0]
        cell[along], cell[across] = line, c
        cells.append(cell)
    return cells


def _spans_board(start: tuple[int, int], goal: tuple[int, int], size: int) -> bool:
    across = 0 if abs(goal[1] - start[1]) >= abs(goal[0] - start[0]) else 1
    return {start[across], goal[across]} == {1, size}


def grid_wall_tasks(n: int, seed: int = 0, split: str = "train", size: int = 7) -> list[Task]:
    """`n` distinct walled-grid tasks of one split (see the module doc), the same for the same arguments;
    train and eval never share a (start, goal) pair (the same hash split as `grid_tasks`)."""
    if split not in ("train", "eval"):
        raise UsageError(f"split must be 'train' or 'eval', got {split!r}")
    pairs = [((sx, sy), (gx, gy))
             for sx in range(1, size + 1) for sy in range(1, size + 1)
             for gx in range(1, size + 1) for gy in range(1, size + 1)
             # a wall needs a line strictly between start and goal on the major axis
             if max(abs(sx - gx), abs(sy - gy)) >= 2 and _split_of((sx, sy), (gx, gy)) == split]
    pairs = [p for p in pairs if not _spans_board(*p, size)]  # a wall across the whole board has no way round
    if n > len(pairs):
        raise UsageError(f"only {len(pairs)} distinct {split} walled tasks exist on a {size}x{size} grid, asked for {n}")
    random.Random(f"walls-{seed}-{split}").shuffle(pairs)
    tasks = []
    for start, goal in pairs[:n]:
        walls = _wall_between(start, goal, size)
        task_id = f"gridw-{size}-{start[0]}{start[1]}-{goal[0]}{goal[1]}"
        tasks.append(Task(id=task_id, instruction=f"Reach the goal on a {size}x{size} grid with a wall.",
                          env="grid", split=split, answer=None,
                          payload={"size": size, "start": list(start), "goal": list(goal), "walls": walls}))
    return tasks
