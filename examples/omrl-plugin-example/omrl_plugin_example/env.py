"""`echo-word`: the instruction names a word; saying it with the `say` tool wins (reward 1), anything else loses."""

from __future__ import annotations

import random

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.toolenv import InvalidAction, ToolEnv

WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "orbit", "piano", "quartz", "tulip", "velvet",
         "willow", "yarrow", "zephyr", "harbor", "lantern"]
TOOLS = [tool_schema("say", "Say one word.", {"word": {"type": "string"}})]


class EchoWordEnv(ToolEnv):
    """Say the word the instruction names (an example plugin environment)."""

    name = "echo-word"
    tools = TOOLS
    splits = ("train", "test")

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train") -> list[Task]:
        """n tasks; train and test draw from disjoint halves of the word list."""
        rng = random.Random(f"echo-word-{split}-{seed}")
        pool = WORDS[: len(WORDS) // 2] if split == "train" else WORDS[len(WORDS) // 2:]
        tasks = []
        for i in range(n):
            word = rng.choice(pool)
            tasks.append(Task(id=f"echo-{split}-{seed}-{i}", instruction=f'Say the word "{word}".', answer=word,
                              env="echo-word", split=split, payload={"word": word}))
        return tasks

    @classmethod
    def unavailable(cls) -> str | None:
        return None  # pure Python: runs anywhere

    def reset(self, task: Task) -> Reset:
        super().__init__()
        self.word = task.payload.get("word") or task.answer
        return Reset(observation=task.instruction, tools=list(TOOLS))

    def tool_say(self, word: str) -> StepResult:
        if not isinstance(word, str) or not word.strip():
            raise InvalidAction("say needs a word")
        self.done = True
        won = word.strip().lower() == self.word
        return StepResult(observation="Correct." if won else f"No, the word was {self.word!r}.",
                          reward=1.0 if won else 0.0, done=True, info={"success": won})

    def expert_action(self) -> Action:
        return Action(tool="say", arguments={"word": self.word})

    def random_action(self, rng: random.Random) -> Action:
        return Action(tool="say", arguments={"word": rng.choice(WORDS)})
