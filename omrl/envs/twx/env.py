"""TextWorldExpress (`--env twx`): fast procedural text games (CookingWorld, Coin, TWC, MapReader, ...).

Needs `pip install 'omrl[twx]'` (textworld-express) and Java 11+ (`make system-deps` installs
openjdk-17-jre-headless). Each environment instance owns one TextWorldExpress JVM, started by the
package through py4j inside an omrl engine process (omrl/envs/engine.py): it is reused across
episodes (`reusable`), replaced when it dies, and never outlives the command. Its heap is capped
(`jvm_heap_mb=512`, the JVM's -Xmx) and so is the engine process with its JVM (`memory_mb`, default the
heap + 512 MB): an engine past its cap is killed, its episode stored as env_error and the engine replaced
(0 turns either off; `omrl envs` says how the cap is held here).

Tasks: `omrl tasks generate twx --split test --option game=coin --option params=numLocations=5`.
Games: cookingworld (default), coin, twc, mapreader, arithmetic, sorting, simonsays, peckingorder.
`params` are the game's own generation properties ("numLocations=5,includeDoors=0"; empty: the
benchmark's defaults). Splits are TextWorldExpress's own seed folds: train (seeds 0-999), dev
(10000-10999), test (20000-20999); the package also draws its objects per fold. The payload holds all
a replay needs: game, params, seed, fold, step_limit and the package version.

Observation: the task description, the game's text, then its valid actions ("Admissible commands: ...",
sorted; `show_actions=false` leaves them out). `observation=brief` keeps only the first sentence of the
game's text ("You are in the kitchen.", "You take the coin."): the rest of a room's description names its
furniture, which the valid actions already list, and costs a small model most of its context. Action: one command through `act(command)`, or plain text
(`action_format=text`). A command the game does not know is answered by the game ("Unknown action")
and marked info.invalid_action. Reward: the change of TextWorldExpress's normalised score, so an
episode's reward is its final score (1.0 when won); success is the game's `tasksuccess`. The game ends
on success, on failure or after `step_limit` moves. Each turn's info holds the scorer's score,
score_raw, success, failure, moves and `state`, a key of the game's state after the step (a digest of its
room description and inventory: equal keys, the same situation; GRPO's step credit groups turns by it).
`show_tried=true` adds the commands already sent in the current state ("Already tried here: move north"),
keyed by that state, after the game's text: the notes an agent would keep, so that a policy need not recall
the whole history to avoid repeating itself (a partially observed search such as Coin otherwise loops).
`--policy scripted` plays the game's gold path, the same for the same task in every process (Coin's and TWC's
gold agents walk at random, seeded here from the task: see engine.py); with `expert=search` (Coin only) it
searches the rooms depth first instead and takes the coin when offered, the best a player seeing one room at a
time can do (a study's ceiling); `--policy random` a random valid action each turn.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import re
import shutil
from dataclasses import dataclass
from typing import Any, Literal

from omrl.envs import textgame
from omrl.envs.base import Action, InvalidTask, Reset, StepResult, Task
from omrl.envs.twx.engine import DEFAULT_STEP_LIMIT, JVM_HEAP_MB, start_engine
from omrl.envs.twx.tasks import FOLD_SEEDS, GAMES, canonical_params, twx_tasks
from omrl.errors import UsageError

OBSERVATIONS = ("full", "brief")  # the game's whole text, or its first sentence (see the module doc)
_FIRST_SENTENCE = re.compile(r"[^\n]*?[.!?](?=\s|$)|[^\n]+")


@dataclass
class TwxOptions:
    """TwxEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    action_format: Literal["tool", "text"] = "tool"
    show_actions: bool = True
    observation: Literal["full", "brief"] = "full"
    show_tried: bool = False
    call_timeout: float = 120.0
    jvm_heap_mb: int = JVM_HEAP_MB
    memory_mb: int | None = None
    expert_detours: float = 0.0
    expert: Literal["gold", "search"] = "gold"


# A move and the move that walks it back (games without doors: every move can be walked back).
_BACK = {"move north": "move south", "move south": "move north", "move east": "move west", "move west": "move east"}


class TwxEnv(textgame.CommandGame):
    """TextWorldExpress games (CookingWorld, Coin, TWC, MapReader...): game text, valid actions, act(command)."""

    name = "twx"
    options_class = TwxOptions
    default_max_turns = DEFAULT_STEP_LIMIT + 10  # the game's own step limit ends it first
    splits = ("train", "dev", "test")  # TextWorldExpress's own seed folds
    reusable = True  # one JVM per instance, kept across episodes

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("textworld_express") is None:
            return "needs the twx extra: pip install 'omrl[twx]'"
        if shutil.which("java") is None:
            return "needs Java 11+ on PATH (apt-get install openjdk-17-jre-headless, or make system-deps)"
        return None

    @classmethod
    def resource_limits(cls) -> str:
        """The default caps of each instance's JVM and engine process, and how the latter is held here."""
        from omrl.envs.engine_memory import jvm_caps, jvm_limits

        return jvm_limits(*jvm_caps("twx", JVM_HEAP_MB, None))

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", game: str = "cookingworld",
                       params: Any = "", step_limit: int = DEFAULT_STEP_LIMIT) -> list[Task]:
        """`n` games of `split` (distinct seeds of TextWorldExpress's fold), the same for the same arguments."""
        return twx_tasks(n, seed=seed, split=split, game=game, params=params, step_limit=step_limit)

    def __init__(self, action_format: str = "tool", show_actions: bool = True, observation: str = "full",
                 show_tried: bool = False, call_timeout: float = 120.0, jvm_heap_mb: int = JVM_HEAP_MB,
                 memory_mb: int | None = None, expert_detours: float = 0.0, expert: str = "gold") -> None:
        super().__init__()
        if not 0.0 <= float(expert_detours) <= 1.0:
            raise UsageError(f"twx expert_detours must be between 0 and 1, got {expert_detours!r}")
        # Demonstrations of lesser quality: at each step of its path the scripted expert first takes a random
        # move with this probability, then walks it back (expert_action).
        self.expert_detours = float(expert_detours)
        if expert not in ("gold", "search"):
            raise UsageError(f"twx expert must be gold or search, got {expert!r}")
        # search: the scripted player a policy that sees one room at a time could at best be on Coin (a
        # depth-first search of the rooms, taking the coin when it is offered): the study's ceiling
        self.expert = expert
        self.search = _Search()
        self.walk_back: list[str] = []
        self.expert_played = 0
        self.expert_rng = random.Random(0)
        self.action_format = textgame.check_action_format(action_format)
        self.show_actions = bool(show_actions)
        if not isinstance(show_tried, bool):  # "false" as text would read as true
            raise UsageError(f"twx show_tried must be true or false, got {show_tried!r}")
        self.show_tried = show_tried
        self.tried: dict[str, list[str]] = {}  # state key -> the commands sent in that state, in order
        self.state = ""
        if observation not in OBSERVATIONS:
            raise UsageError(f"twx observation must be one of {', '.join(OBSERVATIONS)}, got {observation!r}")
        self.observation = observation
        self.fallback = "look around"
        self.engine = start_engine(jvm_heap_mb, memory_mb)
        self.engine.call_timeout = float(call_timeout)
        self.game_args: tuple[Any, ...] = ()
        self.gold: list[str] | None = None  # fetched when the expert is first asked

    def reset(self, task: Task) -> Reset:
        payload = task.payload
        try:
            game, fold = str(payload["game"]), str(payload.get("fold", task.split or "train"))
            args = (game, canonical_params(payload.get("params", "")), int(payload["seed"]), fold,
                    int(payload.get("step_limit", DEFAULT_STEP_LIMIT)))
        except (KeyError, TypeError, ValueError) as exc:  # UsageError from canonical_params included
            raise InvalidTask(f"twx task {task.id}: the payload needs game, seed, fold and optional params and "
                              f"step_limit ({exc})") from None
        if game not in GAMES or fold not in FOLD_SEEDS:
            raise InvalidTask(f"twx task {task.id}: unknown game {game!r} or fold {fold!r}")
        self.engine.ensure()  # a JVM that died between episodes is replaced here
        first = self.engine.call("reset", *args)
        self.game_args, self.sent, self.gold = args, [], None
        self.walk_back, self.expert_played, self.search = [], 0, _Search()
        if self.expert == "search" and game != "coin":
            raise InvalidTask(f"twx task {task.id}: expert=search plays Coin only, not {game}")
        self.expert_rng = random.Random(int(hashlib.sha256(f"twx-detours|{task.id}".encode()).hexdigest()[:16], 16))
        self.commands = sorted(first["actions"])
        self.done = False
        self.tried, self.state = {}, first["state"]
        text = f"{first['task']}\n\n{self._text(first['observation'])}"
        return Reset(observation=textgame.with_commands(text, self.commands if self.show_actions else None),
                     tools=textgame.tools_for(self.action_format),
                     system_prompt=textgame.system_prompt(self.action_format))

    def fingerprint(self, task: Task) -> str | None:
        """The study fingerprint's structure part (omrl.study.fingerprint), right after reset(task): the map,
        the room names and where the objects lie, as the engine built the game (TwxEngine.structure)."""
        game, params, seed, fold, _ = self.game_args
        return self.engine.call("structure", game, params, seed, fold)

    def play(self, command: str) -> StepResult:
        if self.show_tried:
            tried_here = self.tried.setdefault(self.state, [])
            if command not in tried_here:
                tried_here.append(command)
        result = self.engine.call("step", command)
        self.state = result["state"]
        self.commands = sorted(result["actions"])
        self.done = bool(result["done"])
        info: dict[str, Any] = {"score": result["score"], "score_raw": result["score_raw"],
                                "failure": bool(result["failure"]), "moves": int(result["moves"]),
                                "state": result["state"], "note": f"score {result['score']:g}"}  # shown per turn by omrl show and the viewer
        if self.done:
            info["success"] = bool(result["success"])
        text = self._text(result["observation"])
        if self.show_tried and not self.done and self.tried.get(self.state):
            text = f"{text}\n\nAlready tried here: {', '.join(self.tried[self.state])}"
        observation = textgame.with_commands(text, None if self.done or not self.show_actions else self.commands)
        return StepResult(observation, float(result["reward"]), self.done, info)

    def _text(self, text: str) -> str:
        """The game's text as this instance shows it (`observation`: full, or brief: its first sentence)."""
        if self.observation == "full":
            return text
        match = _FIRST_SENTENCE.match(text.strip())
        return match.group(0).strip() if match else text.strip()

    def expert_action(self) -> Action:
        """The gold path's next command; with expert_detours, sometimes first a random move and its way back.
        Asking advances the expert (the scripted policy sends every action it asks for). With expert=search,
        the depth-first searcher's next command instead."""
        if self.expert == "search":
            return textgame.as_action(self.search.next(self.state, self.commands), self.action_format)
        if not self.expert_detours:
            return super().expert_action()
        if self.walk_back:
            return textgame.as_action(self.walk_back.pop(), self.action_format)
        moves = sorted(c for c in self.commands if c in _BACK)
        if moves and self.expert_rng.random() < self.expert_detours:
            move = self.expert_rng.choice(moves)
            self.walk_back.append(_BACK[move])
            return textgame.as_action(move, self.action_format)
        path = self.expert_path()
        command = path[self.expert_played] if self.expert_played < len(path) else self.fallback
        self.expert_played += 1
        return textgame.as_action(command, self.action_format)

    def expert_path(self) -> list[str]:
        """TextWorldExpress's gold path, asked for the first time the expert plays."""
        if self.gold is None:
            self.gold = self.engine.call("gold_path", *self.game_args, self.sent)
        return self.gold


class _Search:
    """A depth-first search of Coin's rooms, one command at a time: take the coin when it is offered; else a
    move not yet tried from this room; a move into a room already seen is walked back at once; a room with
    nothing left to try is left the way the search came in. Rooms are told apart by the game's state key."""

    def __init__(self) -> None:
        self.path: list[str] = []  # the moves from the start room to this one (each into a new room)
        self.tried: dict[str, set[str]] = {}  # room -> moves tried from it (the way in counts as tried)
        self.last: tuple[str, str] | None = None  # (room left, move) of an exploring move, until its room is seen

    def next(self, room: str, commands: list[str]) -> str:
        if "take coin" in commands:
            return "take coin"
        if self.last is not None:
            left, move = self.last
            self.last = None
            if room != left:  # (a move that went nowhere changes nothing)
                if room in self.tried:  # a room seen before: not a new branch
                    return _BACK[move]
                self.tried[room] = {_BACK[move]}  # the way in leads back: nothing new there
                self.path.append(move)
        tried = self.tried.setdefault(room, set())
        for move in sorted(c for c in commands if c in _BACK and c not in tried):
            tried.add(move)
            self.last = (room, move)
            return move
        return _BACK[self.path.pop()] if self.path else "look around"  # searched from here: back one room
