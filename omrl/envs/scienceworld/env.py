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

import random
import shutil
from dataclasses import dataclass
from typing import Any, Literal

from omrl.envs import textgame
from omrl.envs.base import Action, Reset, StepResult, Task
from omrl.envs.engine_memory import jvm_caps, jvm_limits
from omrl.envs.scienceworld.engine import JVM_HEAP_MB, START_TIMEOUT_S, start_engine
from omrl.envs.scienceworld.tasks import sciworld_tasks
from omrl.errors import UsageError

TEMPLATES = "ScienceWorld's commands follow these templates (OBJ is an object you can see):\n{templates}"
UNPARSED = ("No known action matches that input.", "Unknown action.")
# Making a gold path searches the task (mendelian genetics: over 2 minutes at a load of 40 on 2 cores).
GOLD_TIMEOUT_S = 1200.0


@dataclass
class SciWorldOptions:
    """SciWorldEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    action_format: Literal["tool", "text"] = "tool"
    jvm_heap_mb: int = JVM_HEAP_MB
    memory_mb: int | None = None


class SciWorldEnv(textgame.CommandGame):
    """ScienceWorld: 30 science task types, its own train/dev/test variations, scored by the simulator."""

    name = "scienceworld"
    options_class = SciWorldOptions
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
        return sciworld_tasks(n, seed=seed, split=split, tasks=tasks, simplifications=simplifications)

    fallback = "look around"  # the expert's command once its gold path is played out

    def __init__(self, action_format: str = "tool", jvm_heap_mb: int = JVM_HEAP_MB, memory_mb: int | None = None
                 ) -> None:
        super().__init__()
        self.action_format = textgame.check_action_format(action_format)
        self.jvm_heap_mb, self.memory_mb = jvm_caps("scienceworld", jvm_heap_mb, memory_mb)
        self.engine = start_engine(self.jvm_heap_mb, self.memory_mb, call_timeout=120.0)

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
