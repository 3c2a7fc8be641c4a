"""The ScienceWorld engine: its side of the engine process (SciWorldEngine, one simulator and its JVM) and
the EngineWorker that runs it, its JVM's heap and its memory capped."""

from __future__ import annotations

import random
from typing import Any

from omrl.envs.engine import EngineWorker
from omrl.envs.engine_memory import jvm_env

ENGINE = "omrl.envs.scienceworld.engine:SciWorldEngine"
START_TIMEOUT_S = 300.0  # the JVM's start: a few seconds on a quiet machine, much more under load
STEP_LIMIT = 1_000_000  # the simulator's own move limit is never what ends an episode here: max_turns is
JVM_HEAP_MB = 1024  # the simulator's heap; gold paths of the largest task types are made well within it


class SciWorldEngine:
    """What the engine process holds: one ScienceWorld simulator (its JVM is this process's child)."""

    def __init__(self) -> None:
        from scienceworld import ScienceWorldEnv

        self.env = ScienceWorldEnv("", envStepLimit=STEP_LIMIT)
        self.server = self.env.server
        self.loaded: tuple[str, int, str] | None = None
        self.history: list[str] = []

    def load(self, task_name: str, variation: int, simplifications: str = "", gold: bool = False
             ) -> dict[str, Any]:
        """Load one variation and take the first look: the task description, the observation, the templates."""
        self.env.load(task_name, variation, simplifications, generateGoldPath=gold)
        self.loaded, self.history = (task_name, variation, simplifications), []
        self.server.reset()
        observation = self.server.step("look around")  # free: takes no move, as the package's reset does
        return {"task": self.env.get_task_description(), "observation": observation,
                "templates": list(self.env.get_possible_actions())}

    def step(self, command: str) -> dict[str, Any]:
        """One command: the observation, the score (0-100 as ScienceWorld reports it), completion, moves."""
        self.history.append(command)
        observation = self.server.step(command)
        return {"observation": observation, "score": int(round(100 * self.server.getScore())),
                "completed": bool(self.server.getCompleted()), "moves": int(self.server.getNumMoves())}

    def gold_path(self) -> list[str]:
        """The simulator's gold action sequence for the loaded variation; the commands played so far are
        replayed after the reload it needs (a gold path is only made by a load that asks for it)."""
        if self.loaded is None:
            raise RuntimeError("no task is loaded")
        history = list(self.history)
        self.load(*self.loaded, gold=True)
        for command in history:
            self.step(command)
        return list(self.env.get_gold_action_sequence())

    def random_command(self, seed: int) -> str:
        """An action template with random objects of the current world (the random baseline)."""
        rng = random.Random(seed)
        objects = list(self.env.get_possible_objects()) or ["door"]
        template = rng.choice([t for t in self.env.get_possible_actions() if t != "reset task"])
        while "OBJ" in template:
            template = template.replace("OBJ", rng.choice(objects), 1)
        return template

    def variations(self) -> dict[str, Any]:
        """Every task type with its id and train/dev/test variation indices."""
        from scienceworld.constants import ID2TASK

        ids = {name: task_id for task_id, name in ID2TASK.items()}
        out = {}
        for name in self.env.get_task_names():
            self.env.load(name, 0, "", generateGoldPath=False)
            out[name] = {"id": ids.get(name), "train": list(self.env.get_variations_train()),
                         "dev": list(self.env.get_variations_dev()), "test": list(self.env.get_variations_test())}
        return out

    def max_heap_mb(self) -> int:
        """The JVM's own ceiling on its heap, in MB (what -Xmx gave, less a survivor space)."""
        return int(self.env._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory()) >> 20

    def close(self) -> None:
        self.env.close()


def start_engine(heap_mb: int, memory_mb: int, call_timeout: float) -> EngineWorker:
    """A simulator in an engine process, its JVM's heap and the engine's memory capped (0: no cap)."""
    return EngineWorker(ENGINE, name="scienceworld", env=jvm_env(heap_mb), memory_mb=memory_mb,
                        start_timeout=START_TIMEOUT_S, call_timeout=call_timeout)
