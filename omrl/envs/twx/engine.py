"""The TextWorldExpress engine: its side of the engine process (TwxEngine, one JVM through py4j) and the
EngineWorker that runs it, its JVM's heap and its memory capped."""

from __future__ import annotations

import hashlib
from typing import Any

DEFAULT_STEP_LIMIT = 150  # TextWorldExpress says 100, but a default CookingWorld gold path can be longer
# Games whose gold agent walks at random. TextWorldExpress 1.1.0 draws that walk from an unseeded
# scala.util.Random (`new Random()` in CoinGameGenerator's and TWCGameGenerator's mkGameWithGoldPath;
# CookingWorld's is `new Random(seed)`), so its own gold path for the same game differs call to call
# and process to process. omrl runs the same agent with a Random seeded from the task instead.
_WALKING_AGENTS = {"coin": "CoinGoldAgent", "twc": "TWCGoldAgent"}
_GOLD_ATTEMPTS = 50  # the package's generators try a walk this many times
JVM_HEAP_MB = 512  # a TextWorldExpress JVM settles near 300 MB resident when its heap is left to grow


def _state_key(infos: dict[str, Any]) -> str:
    """A key of the game's situation: a digest of its room description and inventory (equal keys, same state)."""
    return hashlib.sha256(f"{infos['look']}\n{infos['inventory']}".encode()).hexdigest()[:16]


class TwxEngine:
    """The engine side (runs in the engine process): one TextWorldExpressEnv and its JVM."""

    def __init__(self) -> None:
        from textworld_express import TextWorldExpressEnv

        self.env = TextWorldExpressEnv(envStepLimit=DEFAULT_STEP_LIMIT)
        self.loaded: tuple[str, str] | None = None

    def _load(self, game: str, params: str) -> None:
        if self.loaded != (game, params):
            self.env.load(game, params)  # raises ValueError naming unknown or out-of-range properties
            self.loaded = (game, params)

    def reset(self, game: str, params: str, seed: int, fold: str, step_limit: int) -> dict[str, Any]:
        self._load(game, params)
        self.env.envStepLimit = step_limit
        # Without the gold path: generating it costs several times the reset itself, and only the expert needs it.
        observation, infos = self.env.reset(seed=seed, gameFold=fold, generateGoldPath=False)
        return {"observation": observation, "task": infos["taskDescription"], "actions": list(infos["validActions"]),
                "state": _state_key(infos)}

    def gold_path(self, game: str, params: str, seed: int, fold: str, step_limit: int,
                  commands: list[str]) -> list[str]:
        """The game's gold path, the same for the same game in every process (see _WALKING_AGENTS).

        A game TextWorldExpress makes its gold path for is reset with it and `commands` (played so far)
        replayed, so the episode goes on where it was (the games are deterministic per seed)."""
        self._load(game, params)
        if game in _WALKING_AGENTS:
            return self._walked_gold_path(game, params, seed, fold)
        self.env.envStepLimit = step_limit
        self.env.reset(seed=seed, gameFold=fold, generateGoldPath=True)
        gold = self.env.getGoldActionSequence()
        for command in commands:
            self.env.step(command)
        return list(gold)

    def _walked_gold_path(self, game: str, params: str, seed: int, fold: str) -> list[str]:
        """The package's gold agent walked on a fresh copy of the game with a Random seeded from the task."""
        jvm = self.env._gateway.jvm
        digest = hashlib.sha256(f"twx-gold|{game}|{params}|{fold}|{seed}".encode()).digest()
        rng = jvm.scala.util.Random(int.from_bytes(digest[:8], "big", signed=True))  # a Java long
        agent = getattr(jvm.textworldexpress.goldagent, _WALKING_AGENTS[game])
        generator = self.env.server.gameGenerator()
        for _ in range(_GOLD_ATTEMPTS):  # as the package's generators: a walk can give up (25 moves)
            found = agent(generator.mkGame(seed, fold)).mkGoldPath(rng)  # a scala Tuple2 (success, path)
            if found._1:
                return list(found._2)
        return []  # what the package answers when no attempt succeeds

    def structure(self, game: str, params: str, seed: int, fold: str) -> str | None:
        """The game as built, for study fingerprints (omrl.study.fingerprint): the agent's start room and every
        room's name and full description (its contents, where the coin lies, its exits), as one text; None
        for a game without rooms. Two seeds that build the same game give the same text."""
        from py4j.protocol import Py4JError

        self._load(game, params)
        built = self.env.server.gameGenerator().mkGame(seed, fold)
        try:
            rooms = sorted(f"{room.name()}: {room.getDescription()}" for room in built.locations())
            start = built.agentLocation().name()
        except Py4JError:  # this game has no locations or no agent location
            return None
        return "\n".join([f"start: {start}", *rooms])

    def step(self, command: str) -> dict[str, Any]:
        observation, reward, done, infos = self.env.step(command)
        return {"observation": observation, "reward": reward, "done": done, "actions": list(infos["validActions"]),
                "score": infos["score"], "score_raw": infos["scoreRaw"], "success": infos["tasksuccess"],
                "failure": infos["taskfailure"], "moves": infos["numMoves"], "state": _state_key(infos)}

    def describe(self, game: str, params: str, fold: str, seeds: list[int]) -> list[str]:
        """The task description of each seed's game (checks the params on the way)."""
        self._load(game, params)
        out = []
        for seed in seeds:
            _, infos = self.env.reset(seed=seed, gameFold=fold, generateGoldPath=False)
            out.append(infos["taskDescription"])
        return out

    def max_heap_mb(self) -> int:
        """The JVM's own ceiling on its heap, in MB (what -Xmx gave, less a survivor space)."""
        return int(self.env._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory()) >> 20

    def close(self) -> None:
        self.env.close()


def start_engine(heap_mb: int = JVM_HEAP_MB, memory_mb: int | None = None):
    """A TextWorldExpress engine process, its JVM's heap and its memory capped (0: no cap)."""
    from omrl.envs.engine import EngineWorker
    from omrl.envs.engine_memory import jvm_caps, jvm_env

    heap_mb, memory_mb = jvm_caps("twx", heap_mb, memory_mb)
    return EngineWorker("omrl.envs.twx.engine:TwxEngine", name="twx", env=jvm_env(heap_mb), memory_mb=memory_mb)
