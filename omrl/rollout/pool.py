"""Environments for episodes: made in a worker thread and always closed, or for `reusable` classes (JVMs,
browsers) kept in an EnvPool between episodes, shared by every call inside shared_engines().
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from omrl.errors import UsageError

EnvFactory = Callable[[], Any]


def env_factory(env_spec: str | EnvFactory, env_options: dict[str, Any] | None = None) -> EnvFactory:
    """A callable making a fresh environment: `env_spec` itself when callable, else `make_env(spec, **options)`."""
    if callable(env_spec):
        return env_spec
    from omrl.envs import make_env

    options = dict(env_options or {})
    return lambda: make_env(env_spec, **options)


class EnvPool:
    """Idle environments kept between episodes, for classes that set `reusable = True` (slow engines).

    `acquire` hands out an idle instance or makes one (in a worker thread; a failing constructor gives
    an instance that fails the episode as env_error); `release(env, reuse=...)` keeps a reusable,
    healthy instance for the next episode and closes every other. `close` closes the idle ones: call
    it when the pool's owner is done (play_episodes does for the pool it made itself).
    """

    def __init__(self, make: EnvFactory) -> None:
        self.make = make
        self.idle: list[Any] = []
        self.made = 0  # instances created: a measure of reuse
        self.closed = False

    async def acquire(self) -> Any:
        if self.closed:
            raise UsageError("this environment pool is closed")
        if self.idle:
            return self.idle.pop()
        self.made += 1
        return await _open(self.make)

    async def release(self, env: Any, task: Any, *, reuse: bool) -> None:
        if reuse and not self.closed and getattr(env, "reusable", False) is True:
            self.idle.append(env)
        else:
            await _close(env, task)

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for env in idle:
            await _close(env, None)

    def __len__(self) -> int:
        return len(self.idle)


_SHARED_POOLS: contextvars.ContextVar[dict[str, EnvPool] | None] = contextvars.ContextVar("omrl_shared_pools",
                                                                                        default=None)


@contextlib.contextmanager
def shared_engines() -> Iterator[dict[str, EnvPool]]:
    """Inside this block every collect, eval and trainer of this process that plays environment NAME with the
    same options draws from one EnvPool: reusable engines (JVMs, game interpreters) start once for the block,
    not once per call. The pools are closed when the block ends (calls must not overlap in time).

        with shared_engines():
            run_iterate(recipe); train_grpo(...); evaluate_checkpoint(...)
    """
    if _SHARED_POOLS.get() is not None:  # nested: the outer block owns the pools
        yield _SHARED_POOLS.get()
        return
    pools: dict[str, EnvPool] = {}
    token = _SHARED_POOLS.set(pools)
    try:
        yield pools
    finally:
        _SHARED_POOLS.reset(token)
        for pool in pools.values():
            asyncio.run(pool.close())


def env_pool(env: str, env_options: dict[str, Any] | None = None) -> tuple[EnvPool | None, bool]:
    """(pool, owned) for environment `env` with `env_options`: inside shared_engines() the block's pool for
    them (owned False: the block closes it), else (None, True): the caller makes and closes its own."""
    pools = _SHARED_POOLS.get()
    if pools is None or not isinstance(env, str):
        return None, True
    key = json.dumps([env, env_options or {}], sort_keys=True, default=str)
    if key not in pools:
        pools[key] = EnvPool(env_factory(env, env_options))
    return pools[key], False


async def _open(make: EnvFactory) -> Any:
    """A new environment, made in a worker thread; a failing constructor gives a _BrokenEnv.

    Cancelled while the constructor runs, the environment it still returns is closed, never leaked.
    """
    lock = threading.Lock()
    state: dict[str, Any] = {"cancelled": False, "env": None}

    def made() -> Any:
        env = make()
        with lock:
            if state["cancelled"]:
                _close_quietly(env)
                return None
            state["env"] = env
        return env

    try:
        return await asyncio.to_thread(made)
    except asyncio.CancelledError:
        with lock:
            state["cancelled"] = True
            env = state["env"]
        if env is not None:  # made, but the result did not reach us
            _close_quietly(env)
        raise
    except Exception as exc:
        return _BrokenEnv(f"creating the environment failed: {type(exc).__name__}: {exc}")


async def _close(env: Any, task: Any) -> None:
    try:
        await asyncio.shield(asyncio.to_thread(env.close))
    except asyncio.CancelledError:
        raise  # the close thread still runs to its end
    except Exception as exc:  # the row is already complete; a failing close is only reported
        where = f" for task {task.id!r}" if task is not None else ""
        warnings.warn(f"env.close failed{where}: {exc}", stacklevel=1)


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception as exc:
        warnings.warn(f"env.close failed: {exc}", stacklevel=1)


class _BrokenEnv:
    """Stands in for an environment that could not be created, so the episode is stored as env_error."""

    name = "unavailable"

    def __init__(self, error: str):
        self.error = error

    def reset(self, task: Any):
        raise RuntimeError(self.error)

    def step(self, action: Any):  # pragma: no cover - reset always fails first
        raise RuntimeError(self.error)

    def close(self) -> None:
        pass
