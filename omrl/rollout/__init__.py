"""The episode runner and the rollout engine: one lifecycle for collect, eval, GRPO, RFT and iterate.

The package's public names; each lives in the module with its one job (settings, pool, episodes,
collection, evaluation, agent, executor, ray_executor).

    settings = RolloutSettings(env="math", max_turns=8, concurrency=32)
    episodes = await play_episodes([(task, 0), (task, 1)], None, policy, settings, run_id="r")
    result = await collect(None, tasks, policy, store, settings, samples=4)

- `play_episodes` owns an episode's lifecycle: a fresh environment per episode, made in a worker
  thread and always closed (or, for `reusable` environments such as JVM or browser engines, taken
  from an EnvPool, reset by the next episode, and closed and replaced after a failure); a per-episode
  seed; a broken environment becomes an env_error row; at most `concurrency` episodes in flight, so a
  slow episode never holds up the others. It writes nothing: storing rows is the caller's step.
- `collect` plays the (task, sample) jobs not yet stored and appends finished rows in batches (every
  `batch_size` episodes or `flush_seconds`, and at the end); each append is one atomic part, so a
  killed run loses at most the episodes in flight and the unflushed batch. Where the episodes play is
  the `executor` it is given (omrl.rollout.executor: this process, or Ray through EpisodeWork), how progress is
  shown the `reporter` (omrl.progress); it asks neither.
- Resume: ids are deterministic in (run, round, task, sample) and those already in the store are
  skipped, so re-running the same command continues where it stopped and never duplicates.
"""

from omrl.rollout.collection import CollectResult, EpisodeWork, RowWriter, collect, default_run_name
from omrl.rollout.episodes import episode_seed, play_episodes
from omrl.rollout.evaluation import EvalResult, eval_metrics, evaluate, pass_at_k
from omrl.rollout.pool import EnvFactory, EnvPool, env_factory, env_pool, shared_engines
from omrl.rollout.settings import DEFAULT_MAX_TURNS, RolloutSettings, placement, turn_budget

__all__ = [
    "DEFAULT_MAX_TURNS", "CollectResult", "EnvFactory", "EnvPool", "EpisodeWork", "EvalResult", "RolloutSettings",
    "RowWriter", "collect", "default_run_name", "env_factory", "env_pool", "episode_seed", "eval_metrics",
    "evaluate", "pass_at_k", "placement", "play_episodes", "shared_engines", "turn_budget",
]
