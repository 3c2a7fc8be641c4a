"""`scienceworld`: ScienceWorld (Wang et al., 2022), 30 elementary-science task types in a text simulator.

Needs the scienceworld package (its simulator is a jar inside it) and Java: `pip install 'omrl[scienceworld]'`
and a Java runtime (`make system-deps`, or `apt-get install openjdk-17-jre-headless`).

Tasks: `omrl tasks generate scienceworld --split test --n 50` draws (task type, variation) pairs from
ScienceWorld's own train/dev/test variation splits: the task types in a seeded order, round robin, each
with a variation of that split not drawn before (`--option tasks=boil,freeze` narrows the types,
`--option simplifications=easy` adds ScienceWorld's simplifications). The payload holds the task name,
its id ("1-1"), the variation, the simplifications and the scienceworld version: enough to replay it.
The variation lists come from the simulator once per scienceworld version and are cached in
~/.cache/omrl/scienceworld/VERSION/variations.json (about 30 task loads).

Observations are the simulator's text: the first one is the task description and what "look around"
shows, the system prompt lists the action templates (open OBJ, move OBJ to OBJ, focus on OBJ, ...).
The agent types one command per step through the `act` tool (or as plain text with
`--env-option action_format=text`; the act tool, command reading and stepping are the text games',
omrl.envs.textgame); a command the simulator cannot parse is an observation
("No known action matches that input."), marked invalid in the step's info.

Reward and success come from the simulator: its score (0-100, negative when the task failed) is
normalised to 0-1 and paid as it grows (the episode's reward is the final score / 100, a failure counts
as 0), the episode ends when the task is completed or failed, and success is ScienceWorld's completion
flag. Each step's info has `score` and `moves`. The expert (`--policy scripted`) plays the simulator's
gold path (asked for the first time the expert acts); gold paths are up to ~180 steps, so give
`--max-turns 200` for it. The random policy types a random action template filled with random objects.

The simulator's JVM runs inside an engine process (omrl.envs.engine.EngineWorker) that never outlives omrl
(SIGKILL included); environments are reusable, so one JVM plays episode after episode. A JVM that dies
mid-episode makes the episode an env_error, and the episode runner replaces that environment.
Memory: the JVM's heap is capped (`--env-option jvm_heap_mb=1024`, its -Xmx) and so is the engine process
with its JVM (`memory_mb`, default the heap + 512 MB); an engine past its cap is killed, its episode stored
as env_error and the engine replaced, so collect holds at most episodes in flight x memory_mb in engines
(`omrl envs` says how the cap is held here; 0 turns either off). Uncapped, each JVM grows towards a quarter
of the host's memory: the simulator allocates on every step and the JVM collects only when its heap is full.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from functools import cache
from pathlib import Path
from typing import Any

from omrl.envs import textgame
from omrl.envs.base import Action, Reset, StepResult, Task
from omrl.envs.engine import EngineWorker
from omrl.envs.engine_memory import jvm_caps, jvm_env, jvm_limits
from omrl.errors import UsageError

ENGINE = "omrl.envs.scienceworld:SciWorldEngine"
TEMPLATES = "ScienceWorld's commands follow these templates (OBJ is an object you can see):\n{templates}"
UNPARSED = ("No known action matches that input.", "Unknown action.")
START_TIMEOUT_S = 300.0  # the JVM's start: a few seconds on a quiet machine, much more under load
# Making a gold path searches the task (mendelian genetics: over 2 minutes at a load of 40 on 2 cores).
GOLD_TIMEOUT_S = 1200.0
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


def _engine(heap_mb: int, memory_mb: int, call_timeout: float) -> EngineWorker:
    """A simulator in an engine process, its JVM's heap and the engine's memory capped (0: no cap)."""
    return EngineWorker(ENGINE, name="scienceworld", env=jvm_env(heap_mb), memory_mb=memory_mb,
                        start_timeout=START_TIMEOUT_S, call_timeout=call_timeout)


@cache
def variation_table() -> dict[str, dict[str, Any]]:
    """{task name: {"id", "train", "dev", "test"}} for the installed scienceworld, from the per-version cache
    (made by the simulator on first use)."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = home / "omrl" / "scienceworld" / str(textgame.installed_version("scienceworld")) / "variations.json"
    if path.exists():
        return json.loads(path.read_text())
    engine = _engine(*jvm_caps("scienceworld", JVM_HEAP_MB, None), call_timeout=600.0)
    try:
        table = engine.call("variations")
    finally:
        engine.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(table))
    os.replace(partial, path)  # whole or absent: concurrent first uses write the same table
    return table


class SciWorldEnv(textgame.CommandGame):
    """ScienceWorld: 30 science task types, its own train/dev/test variations, scored by the simulator."""

    name = "scienceworld"
    default_max_turns = 200  # gold paths run up to ~180 steps
    splits = ("train", "dev", "test")  # ScienceWorld's own variation splits, per task type
    reusable = True  # one JVM plays episode after episode

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import scienceworld  # noqa: F401
        except ImportError:
            return "needs the scienceworld package: pip install 'omrl[scienceworld]'"
        if shutil.which("java") is None:
            return "needs Java to run the simulator: make system-deps (or apt-get install openjdk-17-jre-headless)"
        return None

    @classmethod
    def resource_limits(cls) -> str:
        """The default caps of each environment's simulator, and how the engine's is held on this host."""
        return jvm_limits(*jvm_caps("scienceworld", JVM_HEAP_MB, None))

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", tasks: Any = None,
                       simplifications: str = "") -> list[Task]:
        """`n` (task type, variation) pairs of `split`: task types in a seeded order, round robin, each with
        a variation of the split not drawn before; the same arguments give the same tasks."""
        table = variation_table()
        names = sorted(table)
        if tasks:
            wanted = [t.strip() for t in (tasks if isinstance(tasks, list) else str(tasks).split(",")) if t.strip()]
            by_id = {v["id"]: k for k, v in table.items()}
            unknown = [t for t in wanted if t not in table and t not in by_id]
            if unknown:
                raise UsageError(f"unknown ScienceWorld task(s) {unknown}; known: {', '.join(names)}")
            names = sorted({by_id.get(t, t) for t in wanted})
        rng = random.Random(f"scienceworld-{seed}-{split}")
        pools = {name: rng.sample(table[name][split], len(table[name][split])) for name in names}
        order = rng.sample(names, len(names))
        available = sum(len(p) for p in pools.values())
        if n > available:
            raise UsageError(f"scienceworld {split} has {available} variations of the chosen tasks, asked for {n}")
        out: list[Task] = []
        version = textgame.installed_version("scienceworld")
        while len(out) < n:
            for name in order:
                if pools[name] and len(out) < n:
                    variation = pools[name].pop()
                    task_id = table[name]["id"]
                    out.append(Task(
                        id=f"scienceworld-{name}-{variation}" + (f"-{simplifications}" if simplifications else ""),
                        instruction=f"ScienceWorld task {task_id} ({name}), variation {variation}", env="scienceworld",
                        split=split, payload={"task_name": name, "task_id": task_id, "variation": variation,
                                              "simplifications": simplifications, "scienceworld_version": version}))
        return out

    fallback = "look around"  # the expert's command once its gold path is played out

    def __init__(self, action_format: str = "tool", jvm_heap_mb: int = JVM_HEAP_MB, memory_mb: int | None = None
                 ) -> None:
        super().__init__()
        self.action_format = textgame.check_action_format(action_format)
        self.jvm_heap_mb, self.memory_mb = jvm_caps("scienceworld", jvm_heap_mb, memory_mb)
        self.engine = _engine(self.jvm_heap_mb, self.memory_mb, call_timeout=120.0)

    def reset(self, task: Task) -> Reset:
        payload = task.payload
        name, variation = payload.get("task_name"), payload.get("variation")
        if not isinstance(name, str) or not isinstance(variation, int):
            raise UsageError(f"scienceworld task {task.id}: the payload needs task_name and an integer variation "
                             "(generate tasks with `omrl tasks generate scienceworld`)")
        self.engine.ensure()
        first = self.engine.call("load", name, variation, str(payload.get("simplifications") or ""),
                                 timeout=START_TIMEOUT_S)
        self.score = 0  # the normalised score paid so far, in points (0-100)
        self.gold: list[str] | None = None
        self.commands, self.sent, self.done = [], [], False  # the simulator lists no admissible commands
        system = textgame.system_prompt(self.action_format) + "\n" + TEMPLATES.format(
            templates=", ".join(first["templates"]))
        observation = f"Task: {first['task'].strip()}\n\n{first['observation'].strip()}"
        return Reset(observation=observation, tools=textgame.tools_for(self.action_format), system_prompt=system)

    def play(self, command: str) -> StepResult:
        """One command through the simulator: the score's growth as reward, the end on completion or failure."""
        result = self.engine.call("step", command)
        points = max(result["score"], 0)
        reward, self.score = (points - self.score) / 100.0, points
        info: dict[str, Any] = {"score": result["score"], "moves": result["moves"],
                                "note": f"score {result['score']}"}
        if result["observation"].strip().startswith(UNPARSED):
            info["invalid_action"] = True
        if result["completed"] or result["score"] < 0:
            self.done = True
            info.update(success=result["completed"], completed=result["completed"], failed=result["score"] < 0)
        return StepResult(result["observation"].strip(), reward, self.done, info)

    def expert_path(self) -> list[str]:
        """The simulator's gold path (asked for the first time the expert acts)."""
        if self.gold is None:
            self.gold = self.engine.call("gold_path", timeout=GOLD_TIMEOUT_S)
        return self.gold

    def random_action(self, rng: random.Random) -> Action:
        """A random action template filled with random objects (ScienceWorld lists no admissible commands)."""
        return textgame.as_action(self.engine.call("random_command", rng.randrange(2 ** 31)), self.action_format)
