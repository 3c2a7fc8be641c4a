"""TextWorld (`--env textworld`): generated text adventures, the engine ALFWorld is built on.

Needs `pip install 'omrl[textworld]'` (textworld, which builds jericho; its Inform 7 compiler is
bundled). Each environment instance owns one engine process (omrl/envs/engine.py) that builds, loads
and plays the games: reused across episodes (`reusable`), replaced when it dies, never leaked.

Tasks: `omrl tasks generate textworld --split test --option theme=cooking --option recipe=3`.
- theme `cooking` (default): the First TextWorld Problems cooking games. Options: recipe (ingredients,
  1-5; 2), take (ingredients to find, <= recipe; 1), go (rooms: 1, 6, 9 or 12; 6), open, cook, cut (true),
  drop (limited inventory; false). The split also picks the cooking game's own food split: held-out
  games use ingredients and preparations never seen in train.
- theme `custom`: `tw-make custom` quests. Options: rooms (1-20; 3), objects (0-40; 6), quest_length
  (1-20; 3).
- max_steps (50): moves before the game counts as lost.
Splits train / validation / test are disjoint by game seed (a hash of the seed decides its split). The
payload holds what a replay needs: theme, seed, options, max_steps and the textworld version. Games
are built on first use (about 5-15 s each on 2 cores) into a cache outside the repository
(OMRL_TEXTWORLD_CACHE, default ~/.cache/omrl/textworld), deterministically from the payload:
a missing or deleted game is rebuilt identically.

Observation: the game's text (the TextWorld banner dropped), then the admissible commands sorted
("Admissible commands: ...", as ETO / AgentGym prompts show them; `admissible=false` leaves them out).
Action: one command through `act(command)`, or plain text (`action_format=text`). A command the game
does not understand is answered by the game ("That's not a verb I recognise.") and marked
info.invalid_action when it is not admissible. Reward: the change in score / max_score, so an
episode's reward is its normalised score; success is TextWorld's `won` (a `lost` game or max_steps
ends it unsuccessfully). Each turn's info: score, max_score, won, lost, moves. `--policy scripted`
plays the game's walkthrough; `--policy random` a random admissible command.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from omrl.envs import textgame
from omrl.envs.base import InvalidTask, Reset, StepResult, Task
from omrl.envs.textworld.tasks import (
    DEFAULT_MAX_STEPS,
    SPLITS,
    THEMES,
    check_options,
    package_version,
    split_of,
    textworld_tasks,
)

_COOKING_SPLIT = {"train": "train", "validation": "valid", "test": "test"}  # the cooking game's food splits


def cache_dir() -> Path:
    """Where built games are kept: $OMRL_TEXTWORLD_CACHE, else ~/.cache/omrl/textworld."""
    configured = os.environ.get("OMRL_TEXTWORLD_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "omrl" / "textworld"


def game_key(payload: dict[str, Any]) -> str:
    """The cache name of a payload's game: its theme, seed and options, and the textworld that builds it."""
    what = {"theme": payload["theme"], "seed": int(payload["seed"]), "options": payload["options"],
            "textworld": package_version()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


# ---------------------------------------------------------------- the engine side (runs in the engine process)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two engines building the same game build it once
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _strip_banner(text: str) -> str:
    """The game's text without TextWorld's ASCII-art logo (decoration, ~1,000 characters of tokens)."""
    lines = text.splitlines()
    start = 0
    for i, line in enumerate(lines):
        if line.strip() and not set(line) <= set(" _|\\/$<>="):
            start = i
            break
    return "\n".join(lines[start:]).strip()


def build_game(payload: dict[str, Any], directory: Path | None = None) -> dict[str, Any]:
    """The payload's game, built into the cache unless it is there: {"path", "walkthrough", "objective",
    "max_score"}. Deterministic: the same payload builds the same game file."""
    directory = directory or cache_dir()
    key = game_key(payload)
    meta_path = directory / f"{key}.meta.json"
    if meta_path.exists():
        return {**json.loads(meta_path.read_text()), "path": str(directory / f"{key}.z8")}
    with _locked(directory / f"{key}.lock"):
        if meta_path.exists():  # built by another engine while this one waited
            return {**json.loads(meta_path.read_text()), "path": str(directory / f"{key}.z8")}
        with tempfile.TemporaryDirectory(dir=directory, prefix=f".{key}-") as scratch:
            game = _make(payload, Path(scratch))
            import textworld

            options = textworld.GameOptions()
            options.path = str(Path(scratch) / f"{key}.z8")
            options.force_recompile = True
            built = Path(textworld.generator.compile_game(game, options))
            walkthrough = list(game.metadata.get("walkthrough") or game.walkthrough or [])
            meta = {"walkthrough": walkthrough, "objective": game.objective, "max_score": game.max_score,
                    "textworld": package_version(), "theme": payload["theme"], "seed": int(payload["seed"]),
                    "options": payload["options"]}
            for suffix in (".json", ".z8"):
                os.replace(built.with_suffix(suffix), directory / f"{key}{suffix}")
            (Path(scratch) / "meta.json").write_text(json.dumps(meta))
            os.replace(Path(scratch) / "meta.json", meta_path)  # last: its presence means the game is whole
    return {**meta, "path": str(directory / f"{key}.z8")}


_KB_CACHE: dict[tuple[str | None, str | None, str | None], Any] = {}


def _shared_knowledge_base(original_load):
    """KnowledgeBase.load memoised in this engine process: parsing the logic files costs ~4 s a game and
    gives the same knowledge base each time (tests/test_env_textworld.py checks the games are identical)."""

    def load(target_dir=None, logic_path=None, grammar_path=None):
        key = (target_dir, logic_path, grammar_path)
        if key not in _KB_CACHE:
            _KB_CACHE[key] = original_load(target_dir=target_dir, logic_path=logic_path, grammar_path=grammar_path)
        return _KB_CACHE[key]

    return load


def _make(payload: dict[str, Any], scratch: Path):
    import textworld
    from textworld.generator.data import KnowledgeBase

    theme, game_seed, options = payload["theme"], int(payload["seed"]), payload["options"]
    game_options = textworld.GameOptions()
    game_options.seeds = game_seed
    game_options.path = str(scratch) + "/"
    if theme == "cooking":
        from textworld.challenges.tw_cooking import cooking

        if not getattr(cooking, "_omrl_shared_kb", False):
            cooking.KnowledgeBase = type("KnowledgeBase", (KnowledgeBase,), {
                "load": staticmethod(_shared_knowledge_base(KnowledgeBase.load))})
            cooking._omrl_shared_kb = True
        settings = {key: options[key] for key in THEMES["cooking"]}
        settings["split"] = _COOKING_SPLIT[split_of(game_seed)]
        # A recipe drawn from the seed needs ingredients to fetch (the package's own rule).
        settings["recipe_seed"] = game_seed if options["take"] > 0 else 0
        return cooking.make(settings, game_options)
    game_options.kb = KnowledgeBase.default()  # the package's shared default knowledge base
    game_options.nb_rooms = options["rooms"]
    game_options.nb_objects = options["objects"]
    game_options.quest_length = options["quest_length"]
    return textworld.generator.make_game(game_options)


class TextWorldEngine:
    """The engine side: builds games (cached), loads one, plays it with TextWorld's state tracking."""

    def __init__(self, cache: str | None = None) -> None:
        import textworld

        self.textworld = textworld
        self.cache = Path(cache) if cache else None
        self.env: Any = None
        self.path: str | None = None
        self.admissible = True

    def build(self, payload: dict[str, Any]) -> dict[str, Any]:
        return build_game(payload, self.cache)

    def reset(self, payload: dict[str, Any], admissible: bool) -> dict[str, Any]:
        game = self.build(payload)
        if self.env is None or self.path != game["path"] or self.admissible != admissible:
            if self.env is not None:
                self.env.close()
                self.env = None
            infos = self.textworld.EnvInfos(admissible_commands=admissible, won=True, lost=True, score=True,
                                            max_score=True, moves=True)
            self.env = self.textworld.start(game["path"], infos)
            self.path, self.admissible = game["path"], admissible
        state = self.env.reset()
        return {"text": _strip_banner(state.feedback), "commands": self._commands(state),
                "max_score": state["max_score"], "walkthrough": game["walkthrough"], "objective": game["objective"]}

    def _commands(self, state) -> list[str]:
        return sorted(state["admissible_commands"] or []) if self.admissible else []

    def step(self, command: str) -> dict[str, Any]:
        state, score, done = self.env.step(command)
        return {"text": state.feedback.strip(), "commands": self._commands(state), "score": score,
                "max_score": state["max_score"], "won": bool(state["won"]), "lost": bool(state["lost"]),
                "moves": state["moves"], "done": bool(done)}

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


def _engine(cache: str | None):
    from omrl.envs.engine import EngineWorker

    # A fixed hash seed: TextWorld's generator iterates over sets of names, so the same payload builds the
    # same game only when string hashing is the same in every engine process.
    return EngineWorker("omrl.envs.textworld.env:TextWorldEngine", {"cache": cache}, name="textworld",
                        env={"PYTHONHASHSEED": "0"})


def build_games(tasks: list[Task], cache: str | None = None) -> None:
    """Build the games of `tasks` into the cache now (those missing), in one engine process."""
    engine = _engine(cache)
    try:
        for task in tasks:
            engine.call("build", TextWorldEnv.payload_of(task), timeout=900)
    finally:
        engine.close()


@dataclass
class TextWorldOptions:
    """TextWorldEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    action_format: Literal["tool", "text"] = "tool"
    admissible: bool = True
    cache: str | None = None
    call_timeout: float = 120.0
    build_timeout: float = 900.0


class TextWorldEnv(textgame.CommandGame):
    """TextWorld text adventures (cooking or custom quests), generated locally; act(command)."""

    name = "textworld"
    options_class = TextWorldOptions
    default_max_turns = DEFAULT_MAX_STEPS + 10  # the game's own move limit ends it first
    splits = SPLITS
    reusable = True  # one engine process per instance, kept across episodes

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("textworld") is None:
            return "needs the textworld extra: pip install 'omrl[textworld]'"
        return None

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", theme: str = "cooking",
                       max_steps: int = DEFAULT_MAX_STEPS, **options: Any) -> list[Task]:
        """`n` games of `split` (distinct game seeds of that split), the same for the same arguments; the
        games themselves are built on first use (or by `build_games`)."""
        return textworld_tasks(n, seed=seed, split=split, theme=theme, max_steps=max_steps, **options)

    @staticmethod
    def payload_of(task: Task) -> dict[str, Any]:
        """The task's payload checked and completed (defaults of its theme), or InvalidTask naming the task."""
        payload = task.payload
        try:
            theme, game_seed = str(payload.get("theme", "cooking")), int(payload["seed"])
            options = check_options(theme, dict(payload.get("options") or {}))
            max_steps = int(payload.get("max_steps", DEFAULT_MAX_STEPS))
        except (KeyError, TypeError, ValueError) as exc:  # UsageError from check_options included
            raise InvalidTask(f"textworld task {task.id}: the payload needs theme, seed and options ({exc})") from None
        return {"theme": theme, "seed": game_seed, "options": options, "max_steps": max_steps}

    def __init__(self, action_format: str = "tool", admissible: bool = True, cache: str | None = None,
                 call_timeout: float = 120.0, build_timeout: float = 900.0) -> None:
        super().__init__()
        self.action_format = textgame.check_action_format(action_format)
        self.admissible = bool(admissible)
        self.build_timeout = float(build_timeout)
        self.engine = _engine(str(cache) if cache else None)
        self.engine.call_timeout = float(call_timeout)
        self.walkthrough: list[str] = []
        self.score, self.max_score, self.max_steps = 0, 1, DEFAULT_MAX_STEPS

    def reset(self, task: Task) -> Reset:
        payload = self.payload_of(task)
        self.engine.ensure()  # an engine that died between episodes is replaced here
        first = self.engine.call("reset", payload, self.admissible, timeout=self.build_timeout)
        self.commands, self.walkthrough = first["commands"], list(first["walkthrough"])
        self.sent, self.score, self.max_score = [], 0, max(1, int(first["max_score"]))
        self.max_steps, self.done = payload["max_steps"], False
        return Reset(observation=textgame.with_commands(first["text"], self.commands),
                     tools=textgame.tools_for(self.action_format),
                     system_prompt=textgame.system_prompt(self.action_format))

    def play(self, command: str) -> StepResult:
        result = self.engine.call("step", command)
        self.commands = result["commands"]
        reward = (result["score"] - self.score) / self.max_score
        self.score = result["score"]
        out_of_steps = not (result["won"] or result["lost"]) and len(self.sent) >= self.max_steps
        self.done = bool(result["done"] or result["won"] or result["lost"] or out_of_steps)
        info: dict[str, Any] = {"score": self.score, "max_score": self.max_score, "won": result["won"],
                                "lost": result["lost"], "moves": result["moves"],
                                "note": f"score {self.score}/{self.max_score}"}  # shown per turn by omrl show
        text = result["text"]
        if self.done:
            info["success"] = bool(result["won"])
            if out_of_steps:
                info["out_of_steps"] = True
                text += f"\n\nYou are out of moves ({self.max_steps})."
        return StepResult(textgame.with_commands(text, None if self.done else self.commands), reward, self.done, info)

    def expert_path(self) -> list[str]:
        """The game's walkthrough."""
        return self.walkthrough
