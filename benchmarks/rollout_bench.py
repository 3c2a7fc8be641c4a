"""Rollout benchmark: the async engine (omrl.rollout.collect) against the ideal and against lockstep rollout.

    python benchmarks/rollout_bench.py            # about a minute
    python benchmarks/rollout_bench.py --quick    # a few seconds of each

A fake OpenAI server runs in its own process (asyncio, minimal HTTP/1.1 with keep-alive, so 1024
connections are cheap) and answers every request after a modelled latency: fixed + per-token x
completion tokens (uniform), times a jitter factor. The synthetic environment's episode lengths are
heavy-tailed (Pareto number of turns, capped). The policy is the real `openai:` backend.

- efficiency_C: the turn rate of `collect` at concurrency C (replies from 2 x the mean latency after the
  start until the (N-C)-th episode finished, N = jobs), divided by the ideal C / mean model latency (zero
  overhead). episodes_per_s_C (completions between the C-th and the (N-C)-th) is shown beside it: with
  heavy-tailed episodes started at once it favours the short ones, and can pass its ideal.
- ramp_s_C: seconds until C requests were on the wire at once. The levels run one after the other
  against one server, so from the second on the client starts from the limit on requests in flight the
  one before reached (omrl.llm.endpoint: Memory); the first climbs from one request (omrl.llm.endpoint: START).
- speedup_vs_lockstep: `collect`'s episodes/s over a lockstep loop's at the same concurrency: all C
  episodes step together and every turn waits for the slowest reply, as batch rollout loops do.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema  # noqa: E402


@dataclass
class LatencyModel:
    fixed: float = 0.5
    per_token: float = 0.01
    min_tokens: int = 20
    max_tokens: int = 180
    jitter: float = 0.2  # latency multiplied by uniform(1 - jitter, 1 + jitter)

    @property
    def mean(self) -> float:
        return self.fixed + self.per_token * (self.min_tokens + self.max_tokens) / 2


# ---------------------------------------------------------------- the fake server (own process)


def _completion(request: dict[str, Any], tokens: int, n: int) -> bytes:
    body = {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": request.get("model", "m"),
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {"name": "act", "arguments": "{}"}}],
        }}],
        "usage": {"prompt_tokens": 50, "completion_tokens": tokens, "total_tokens": 50 + tokens},
    }
    return json.dumps(body).encode()


def serve(port_out: Any, model: LatencyModel, seed: int) -> None:
    """Run the fake chat-completions server until killed; sends its port through `port_out`."""
    rng = random.Random(seed)
    counter = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal counter
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    break
                length = 0
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = header.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                request = json.loads(await reader.readexactly(length)) if length else {}
                counter += 1
                tokens = rng.randint(model.min_tokens, model.max_tokens)
                latency = (model.fixed + model.per_token * tokens) * rng.uniform(1 - model.jitter, 1 + model.jitter)
                await asyncio.sleep(latency)
                body = _completion(request, tokens, counter)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client closed the connection; nothing to answer
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=8192)
        port_out.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---------------------------------------------------------------- the synthetic environment


class HeavyTailEnv:
    """Each task lasts payload["turns"] steps of the single tool `act`; the last one pays reward 1."""

    name = "heavy-tail"
    TOOLS = [tool_schema("act", "Take a step.", {}, [])]

    def reset(self, task: Task) -> Reset:
        self.left = task.payload["turns"]
        return Reset(observation=f"{self.left} steps to go", tools=self.TOOLS)

    def step(self, action: Action) -> StepResult:
        self.left -= 1
        done = self.left <= 0
        return StepResult(observation=f"{self.left} steps to go", reward=1.0 if done else 0.0, done=done,
                          info={"success": done})

    def close(self) -> None:
        pass


def heavy_tail_tasks(n: int, rng: random.Random, alpha: float, cap: int) -> list[Task]:
    """Pareto(alpha, x_min=1) number of turns, rounded up, capped."""
    tasks = []
    for i in range(n):
        turns = min(cap, math.ceil((1.0 - rng.random()) ** (-1.0 / alpha)))
        tasks.append(Task(id=f"h{i}", instruction="walk", payload={"turns": turns}))
    return tasks


# ---------------------------------------------------------------- the two engines


class TimedPolicy:
    """Wraps a policy to time-stamp every reply (turn completions measure throughput without episode bias)."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.stamps = inner, inner.name, []

    async def act(self, messages, tools, context):
        reply = await self.inner.act(messages, tools, context)
        self.stamps.append(time.monotonic())
        return reply


async def run_async(base_url: str, concurrency: int, tasks: list[Task], cap: int, warmup: float
                    ) -> tuple[float, float, float | None]:
    """(episodes/s, turns/s, ramp_s) of `collect` while all slots are busy; it is cancelled once the jobs
    run out. ramp_s: seconds until `concurrency` requests were in flight at once (None: never).

    Episodes/s counts completions between the `concurrency`-th and the (n - concurrency)-th. Turns/s
    counts replies from `warmup` seconds after the start to that same end: with heavy-tailed episodes
    started all at once, early episode completions are mostly the short ones, while the turn rate is
    steady from the first round trip on."""
    from omrl.policies import make_policy
    from omrl.rollout import collect
    from omrl.store import Store

    policy = TimedPolicy(make_policy("openai:bench", base_url=base_url, max_connections=concurrency, retries=0))
    n = len(tasks)
    finished: list[float] = []
    enough = asyncio.Event()

    def on_episode(episode: Any) -> None:
        if episode.status != "ok":
            raise RuntimeError(f"benchmark episode failed: {episode.row['error']}")
        finished.append(time.monotonic())
        if len(finished) >= n - concurrency:
            enough.set()

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.create(Path(tmp) / "store")
        started = time.monotonic()
        job = asyncio.create_task(collect(HeavyTailEnv, tasks, policy, store, concurrency=concurrency,
                                          max_turns=cap, run_id="bench", batch_size=256,
                                          on_episode=on_episode))
        waiter = asyncio.create_task(enough.wait())
        filled = asyncio.create_task(time_to_fill(policy.inner.client, concurrency, started))
        await asyncio.wait([job, waiter], return_when=asyncio.FIRST_COMPLETED)
        job.cancel()
        waiter.cancel()
        filled.cancel()
        ramp = filled.result() if filled.done() and not filled.cancelled() else None
        with contextlib.suppress(asyncio.CancelledError):
            await job
        await policy.inner.aclose()
    start, end = concurrency, n - concurrency
    episodes = (end - start) / (finished[end - 1] - finished[start - 1])
    t0, t1 = started + warmup, finished[end - 1]
    turns = sum(1 for t in policy.stamps if t0 < t <= t1) / (t1 - t0)
    return episodes, turns, ramp


async def time_to_fill(client: Any, concurrency: int, started: float) -> float:
    """Seconds from `started` until the client had `concurrency` requests in flight (polled every 50 ms)."""
    while client.throttle is None or client.throttle.peak < concurrency:
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def run_lockstep(base_url: str, concurrency: int, tasks: list[Task]) -> float:
    """Episodes/s when a batch of `concurrency` episodes steps together, each turn waiting for the slowest."""
    from omrl.policies import EpisodeContext, make_policy

    policy = make_policy("openai:bench", base_url=base_url, max_connections=concurrency, retries=0)
    started = time.monotonic()
    done_episodes = 0
    for offset in range(0, len(tasks) - concurrency + 1, concurrency):
        batch = tasks[offset: offset + concurrency]
        envs = [HeavyTailEnv() for _ in batch]
        convs = []
        for env, task in zip(envs, batch, strict=True):
            first = env.reset(task)
            convs.append([{"role": "user", "content": first.observation}])
        contexts = [EpisodeContext(env=env, task=task) for env, task in zip(envs, batch, strict=True)]
        active = list(range(len(batch)))
        while active:
            replies = await asyncio.gather(*(policy.act(convs[i], HeavyTailEnv.TOOLS, contexts[i]) for i in active))
            still = []
            for i, reply in zip(active, replies, strict=True):
                call = reply.tool_calls[0]
                result = envs[i].step(Action(tool=call["name"], arguments={}))
                convs[i] += [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call["id"], "content": result.observation}]
                if not result.done:
                    still.append(i)
            active = still
        done_episodes += len(batch)
    await policy.aclose()
    return done_episodes / (time.monotonic() - started)


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs per level: a smoke run")
    parser.add_argument("--levels", default="64,256,1024", help="concurrency levels")
    parser.add_argument("--jobs-per-slot", type=float, default=2.5, help="jobs = this x concurrency")
    parser.add_argument("--lockstep-concurrency", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=1.5, help="Pareto tail index of episode lengths")
    parser.add_argument("--cap", type=int, default=10, help="longest episode, in turns")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = LatencyModel()
    levels = [int(x) for x in args.levels.split(",")]
    if args.quick:
        model = LatencyModel(fixed=0.15, per_token=0.002)
        levels = [min(level, 256) for level in levels]
        args.jobs_per_slot = 2.5
        args.lockstep_concurrency = 32

    ctx = multiprocessing.get_context("spawn")
    port_out = ctx.Queue()
    server = ctx.Process(target=serve, args=(port_out, model, args.seed), daemon=True)
    server.start()
    base_url = f"http://127.0.0.1:{port_out.get(timeout=30)}/v1"
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"benchmark": "rollout", "latency_mean_s": round(model.mean, 3),
                           "tail_alpha": args.alpha, "max_turns": args.cap}
    try:
        async def run_all() -> None:
            for level in levels:
                tasks = heavy_tail_tasks(int(level * args.jobs_per_slot), rng, args.alpha, args.cap)
                mean_turns = sum(t.payload["turns"] for t in tasks) / len(tasks)
                ideal = level / (mean_turns * model.mean)
                episodes, turns, ramp = await run_async(base_url, level, tasks, args.cap, warmup=2 * model.mean)
                out[f"episodes_per_s_{level}"] = round(episodes, 2)
                out[f"ideal_episodes_per_s_{level}"] = round(ideal, 2)
                out[f"turns_per_s_{level}"] = round(turns, 1)
                out[f"ideal_turns_per_s_{level}"] = round(level / model.mean, 1)
                # The turn rate is the steady measure (see run_async); episodes/s is reported beside it.
                out[f"efficiency_{level}"] = round(turns / (level / model.mean), 3)
                out[f"ramp_s_{level}"] = None if ramp is None else round(ramp, 1)
            c = args.lockstep_concurrency
            tasks = heavy_tail_tasks(c, rng, args.alpha, args.cap)
            lockstep = await run_lockstep(base_url, c, tasks)
            engine, _, _ = await run_async(base_url, c, heavy_tail_tasks(int(c * args.jobs_per_slot), rng,
                                                                      args.alpha, args.cap), args.cap,
                                        warmup=2 * model.mean)
            out["lockstep_concurrency"] = c
            out["lockstep_episodes_per_s"] = round(lockstep, 2)
            out["engine_episodes_per_s_at_lockstep_concurrency"] = round(engine, 2)
            out["speedup_vs_lockstep"] = round(engine / lockstep, 2)

        started = time.monotonic()
        asyncio.run(run_all())
        out["wall_s"] = round(time.monotonic() - started, 1)
    finally:
        server.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
