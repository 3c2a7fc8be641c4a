"""The iterate recipe (omrl.train.iterate.run): its settings sections and the recipe of each round's update step.

    recipe = load_recipe("recipes/quickstart.yaml", IterateRecipe)
    grpo = update_recipe(recipe, "grpo", {"model": "runs/sft", "tasks": "t.jsonl", "output_dir": "o"}, round=1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omrl.errors import UsageError
from omrl.rollout import RolloutSettings
from omrl.train.config.grpo import GRPOSection
from omrl.train.config.ppo import PPOSection
from omrl.train.config.sft import SFTSection

Algorithm = Literal["grpo", "ppo"]  # the TRAINERS an iterate round's update step may be (each has its section)


@dataclass
class TinySettings:
    hidden: int = field(default=128, metadata={"help": "hidden size of the tiny model"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    seed: int = field(default=0, metadata={"help": "seed of the random initial weights"})
    vocab_size: int = field(default=1024, metadata={"help": "BPE vocabulary size of the tokenizer trained on the spot"})
    corpus: Literal["default", "demos"] = field(default="default", metadata={
        "help": "what the tokenizer is trained on: default (chat format and the shipped environments' words) or "
                "demos (that plus the text of the expert demonstrations, collected first: the game's own words "
                "become single tokens, so observations are short)"})


@dataclass
class DemoSettings:
    enabled: bool = field(default=True, metadata={"help": "collect scripted-expert demos and SFT on them first"})
    tasks: int = field(default=0, metadata={"help": "how many training tasks get demos (0 = all)"})
    samples: int = field(default=1, metadata={"help": "expert episodes per task"})
    only_success: bool = field(default=True, metadata={"help": "SFT only on demos that reached the goal"})


@dataclass
class CollectSettings:
    enabled: bool = field(default=True, metadata={
        "help": "collect and filter before each GRPO round; false: GRPO on the whole training file"})
    tasks: int = field(default=64, metadata={"help": "training tasks attempted per round (0 = all)"})
    samples: int = field(default=8, metadata={"help": "attempts per task: the group size"})
    engine: Literal["hf", "vllm"] = field(default="hf", metadata={
        "help": "what plays the round's checkpoint: hf (in this process, batched) or vllm (the checkpoint served "
                "by vLLM on 127.0.0.1 for the collection, then stopped, as eval.engine; its sampled token ids "
                "are stored, and SFT on the best attempts trains from them)"})


@dataclass
class FilterSettings:
    drop_flat: bool = field(default=True, metadata={"help": "train GRPO only on tasks whose group is not flat"})
    sft_best: bool = field(default=False, metadata={"help": "also SFT on the best attempt of each group"})
    min_reward: float = field(default=1.0, metadata={"help": "reward an attempt needs to join the SFT set"})
    reward_recipe: str | dict[str, Any] | None = field(default=None, metadata={
        "help": "combined-reward recipe (omrl annotate) ranking attempts; None = the run's `reward` (else env reward)"})


@dataclass
class EvalSettings:
    tasks: int = field(default=0, metadata={"help": "held-out tasks evaluated (0 = all)"})
    samples: int = field(default=4, metadata={"help": "sampled episodes per task"})
    temperature: float = field(default=1.0, metadata={"help": "temperature of the sampled evaluation"})
    greedy: bool = field(default=True, metadata={"help": "also evaluate greedily (temperature 0, 1 episode)"})
    concurrency: int = field(default=256, metadata={"help": "episodes in flight (one evaluation is one batch)"})
    base_samples: int | None = field(default=None, metadata={
        "help": "sampled episodes per task for the starting checkpoint (None = samples); an untrained model "
                "plays to the turn limit: slow, and scores 0"})
    engine: Literal["hf", "vllm"] = field(default="hf", metadata={
        "help": "what plays a checkpoint in an evaluation: hf (in this process, batched) or vllm (the checkpoint "
                "served by vLLM on 127.0.0.1 for the evaluation, then stopped: `omrl serve vllm --install-only` "
                "first; for a real model on a CPU, collection ran 4x faster and a whole evaluation 1.2x here, plus "
                "a minute to start: docs/results/real_model.md)"})
    max_model_len: int = field(default=4096, metadata={
        "help": "with engine vllm: the served context length (an episode past it ends as truncated)"})


@dataclass
class BaselineSettings:
    expert: bool = field(default=False, metadata={
        "help": "stage 'expert': the scripted expert's own held-out success (the imitation ceiling)"})
    more_sft: bool = field(default=False, metadata={
        "help": "stage 'sft-more': SFT from the SFT checkpoint for GRPO's wall time, evaluated like the rest"})
    more_sft_epochs: int | None = field(default=None, metadata={
        "help": "epochs of the more-SFT run; None = GRPO's measured seconds / the SFT run's seconds per epoch"})


def _iterate_rollout():
    return RolloutSettings(env="grid", max_turns=16, max_new_tokens=16, concurrency=64)


@dataclass
class IterateRecipe:
    """Settings of an iterative run (the learning demo is one)."""

    output_dir: str = field(metadata={"help": "run folder: checkpoints, store, state.json, results.json"})
    train_tasks: str = field(metadata={"help": "training tasks file"})
    eval_tasks: str = field(metadata={"help": "held-out tasks file"})
    rollout: RolloutSettings = field(default_factory=_iterate_rollout, metadata={
        "help": "how every stage plays episodes (omrl.rollout.RolloutSettings); round r seeds with seed + r"})
    model: str | None = field(default=None, metadata={"help": "starting checkpoint; None = build the tiny model"})
    tiny: TinySettings = field(default_factory=TinySettings, metadata={"help": "the tiny model, when model is None"})
    store: str | None = field(default=None, metadata={"help": "store of every stage's data (default output_dir/store)"})
    rounds: int = field(default=3, metadata={"help": "GRPO rounds"})
    seed: int = field(default=0, metadata={"help": "seeds the training stages (rollout.seed: the episodes)"})
    demos: DemoSettings = field(default_factory=DemoSettings, metadata={"help": "expert demonstrations"})
    sft: SFTSection = field(default_factory=SFTSection, metadata={"help": "SFT settings of the demo SFT"})
    collect: CollectSettings = field(default_factory=CollectSettings, metadata={"help": "per-round collection"})
    filter: FilterSettings = field(default_factory=FilterSettings, metadata={"help": "per-round selection"})
    algorithm: Algorithm = field(default="grpo", metadata={
        "help": "the update step of each round: grpo (the grpo section; step_credit there for GiGPO-style "
                "step credit) or ppo (the ppo section: a critic and GAE); stages are named grpo-N or ppo-N"})
    grpo: GRPOSection = field(default_factory=GRPOSection, metadata={
        "help": "GRPO settings of each round (omrl.train.algorithms.grpo); rollouts as the rollout section says"})
    ppo: PPOSection = field(default_factory=PPOSection, metadata={
        "help": "PPO settings of each round with algorithm: ppo (omrl.train.algorithms.ppo); rollouts as the rollout section says"})
    sft_best: SFTSection = field(default_factory=SFTSection, metadata={"help": "SFT settings of the best-of SFT"})
    eval: EvalSettings = field(default_factory=EvalSettings, metadata={"help": "held-out evaluation"})
    baseline: BaselineSettings = field(default_factory=BaselineSettings, metadata={
        "help": "reference rows: the expert, and compute-matched more SFT"})
    threads: int | None = field(default=None, metadata={
        "help": "torch CPU threads (None: torch's default); 1 is fastest for the tiny model on a busy box"})
    report: bool = field(default=False, metadata={"help": "write the omrl report into output_dir/report at the end"})
    reward: str | dict[str, Any] | None = field(default=None, metadata={
        "help": "reward recipe (path or mapping, omrl/annotate/reward.py): its metrics and judges annotate each "
                "round's collection (annotate stage), the filter ranks by it and GRPO trains on it online, "
                "unless filter.reward_recipe / grpo.reward say otherwise; None: the env reward"})
    ray: str | None = field(default=None, metadata={
        "help": "play the collect and eval stages' episodes (demos, each round's collection, every held-out "
                "evaluation) on a Ray cluster: auto (the running one), HOST:PORT or local (start one here), as "
                "omrl collect --ray does, with the rollout section's ray_num_cpus / ray_resources / ray_workers "
                "(each worker loads its own copy of the checkpoint: a low ray_num_cpus lets it batch many "
                "episodes); the annotate stage's judges run there too; training stays in this process. None: every "
                "stage in this process. Needs "
                "`pip install omrl[ray]`"})

    def __post_init__(self) -> None:
        if self.algorithm == "ppo" and (self.reward is not None or self.grpo.reward is not None):
            # PPO trains on the environment's reward; judged rewards reach GRPO and RFT only (for now).
            raise UsageError("algorithm: ppo trains on the environment reward; remove reward / grpo.reward, "
                             "or use algorithm: grpo")
        served = [f"{section}.engine" for section in ("collect", "eval") if getattr(self, section).engine == "vllm"]
        if served and self.ray not in (None, "local"):
            raise UsageError(f"{served[0]} vllm serves the checkpoint on 127.0.0.1, which a Ray cluster's other "
                             f"machines cannot reach: use ray: local, or engine hf with ray: {self.ray}")
        if self.ray is not None:  # without Ray installed: say so at load time, not after SFT
            from omrl.rollout.ray_executor import require_ray

            require_ray()
        if self.reward is not None:  # a broken recipe is refused at load time, not after SFT
            from omrl.annotate.reward import load_reward_recipe

            load_reward_recipe(self.reward)

    @property
    def filter_reward(self) -> str | dict[str, Any] | None:
        """The recipe the round's annotate stage runs and its filter ranks by."""
        return self.filter.reward_recipe if self.filter.reward_recipe is not None else self.reward


def grpo_recipe(recipe: IterateRecipe, values: dict[str, Any], round: int):
    """The GRPORecipe of one round: the grpo section, the run's rollout section seeded for the round, `values`."""
    return update_recipe(recipe, "grpo", values, round)


def update_recipe(recipe: IterateRecipe, algorithm: str, values: dict[str, Any], round: int):
    """The recipe of round `round`'s update step (`algorithm`: grpo or ppo): its section of the iterate recipe,
    the run's rollout section seeded for the round, the run's reward where the section takes one, `values`."""
    from omrl.config import to_dict

    section = getattr(recipe, algorithm)
    rollout = {**to_dict(recipe.rollout), "seed": round_seed(recipe.rollout.seed, round)}
    takes_reward = hasattr(section, "reward")  # GRPO trains on judged rewards; PPO on the env's
    if takes_reward and section.reward is None and recipe.reward is not None and "reward" not in values:
        values = {**values, "reward": recipe.reward}
    return section.to_recipe(seed=recipe.seed + round, rollout=rollout, **values)


def round_seed(seed: int | None, round: int) -> int | None:
    """The rollout seed of round `round`: the run's seed + round (None stays None)."""
    return None if seed is None else seed + round
