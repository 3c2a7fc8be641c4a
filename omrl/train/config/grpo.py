"""The GRPO recipe (omrl.train.algorithms.grpo): its settings section, the full recipe and TRL's GRPOConfig of it.

    recipe = load_recipe("recipes/grpo_grid.yaml", GRPORecipe)   # GRPOSection's settings + model, tasks, ...
    grpo = iterate_recipe.grpo.to_recipe(model="runs/sft", tasks="t.jsonl", output_dir="runs/grpo-1")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omrl.errors import UsageError
from omrl.rollout import RolloutSettings
from omrl.train.config.base import RLSettings, TasksRun, section_recipe, section_values
from omrl.train.rl.step_credit import StepCreditSettings


def _grpo_rollout():
    return RolloutSettings(env="grid", max_turns=16, max_new_tokens=16, concurrency=64)


@dataclass(kw_only=True)
class GRPOSection(RLSettings):
    """The GRPO settings of an iterate round (omrl/train/config/grpo.py); the run sets the checkpoint, tasks,
    folders, round, seed and rollout."""

    run_name: str = field(default="grpo", metadata={"help": "run id prefix of the stored rollouts"})
    samples_per_task: int = field(default=8, metadata={"help": "episodes per task: the GRPO group size"})
    learning_rate: float = field(default=5e-4, metadata={"help": "3e-3 collapsed the tiny model in 40 steps"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warmup"})
    lr_scheduler_type: str = field(default="constant_with_warmup", metadata={"help": "TRL/transformers name"})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; 0 skips the reference model"})
    loss_type: str = field(default="dapo", metadata={"help": "TRL GRPO loss type"})
    max_completion_length: int = field(default=160, metadata={"help": "TRL's completion budget (logging)"})
    reward: str | dict[str, Any] | None = field(default=None, metadata={
        "help": "combined-reward recipe (path or mapping, as `omrl annotate --reward-recipe`): its metrics and "
                "judges score each group as it finishes, every score stored (needs store); None: the env reward"})
    step_credit: StepCreditSettings | None = field(default=None, metadata={
        "help": "GiGPO-style step credit (omrl/train/rl/step_credit.py): turns of a group that share an env "
                "state (info.state) are compared, their step advantage added per token; {} for defaults; "
                "None: plain GRPO"})
    use_vllm: bool = field(default=False, metadata={"help": "generate with TRL's vLLM integration (CUDA GPU and "
                                                            "`pip install vllm` needed; see module doc)"})
    vllm_mode: Literal["colocate", "server"] = field(default="colocate", metadata={
        "help": "colocate (a vLLM engine in the training process) or server (`trl vllm-serve`)"})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "help": "GPU memory share of the colocated vLLM engine"})
    vllm_server_base_url: str | None = field(default=None, metadata={
        "help": "server mode: base URL of `trl vllm-serve` (default: TRL's localhost:8000)"})
    trl: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "more settings of TRL's GRPOConfig, passed as given (e.g. {max_grad_norm: 0.5}); a key that is "
                "not a GRPOConfig field, or one omrl sets from the keys above, is refused at load time"})

    def __post_init__(self) -> None:
        if self.reward is not None:  # a broken recipe is refused at load time, not at the first step
            from omrl.annotate.reward import load_reward_recipe

            load_reward_recipe(self.reward)
        if self.trl:  # so is a bad trl section (building the config checks it)
            trl_config(self if isinstance(self, GRPORecipe)
                       else GRPORecipe(model="-", tasks="-", output_dir="-", **section_values(self)))

    def to_recipe(self, **run: Any) -> GRPORecipe:
        """The full GRPORecipe: this section's settings and the run's keys (`run` wins)."""
        return section_recipe(self, GRPORecipe, run)


@dataclass(kw_only=True)
class GRPORecipe(GRPOSection, TasksRun):
    """Settings of one GRPO run; defaults are the ones the CPU feasibility probe found stable."""

    rollout: RolloutSettings = field(default_factory=_grpo_rollout, metadata={
        "help": "how rollouts are played (omrl.rollout.RolloutSettings); a step plays all its episodes at once "
                "(one generation batch), so concurrency only raises that"})
    store: str | None = field(default=None, metadata={"help": "store that receives every rollout group"})


def on_cpu(recipe: GRPORecipe) -> bool:
    """Whether the run trains on the CPU: the recipe's use_cpu, else when no CUDA GPU is there."""
    import torch

    return recipe.use_cpu if recipe.use_cpu is not None else not torch.cuda.is_available()


def trl_config(recipe: GRPORecipe):
    """TRL's GRPOConfig: what omrl derives from the recipe's keys, plus its `trl` section passed through."""
    from trl import GRPOConfig

    from omrl.config import pass_through

    vllm: dict[str, Any] = {}
    if recipe.use_vllm:
        if on_cpu(recipe):
            raise UsageError("use_vllm needs a CUDA GPU (and `pip install vllm`); this run is on the CPU: "
                             "set use_vllm: false to generate with transformers")
        vllm = {"use_vllm": True, "vllm_mode": recipe.vllm_mode,
                "vllm_gpu_memory_utilization": recipe.vllm_gpu_memory_utilization}
        if recipe.vllm_server_base_url:
            vllm["vllm_server_base_url"] = recipe.vllm_server_base_url
    return pass_through(GRPOConfig, dict(
        output_dir=recipe.output_dir,
        per_device_train_batch_size=recipe.tasks_per_step * recipe.samples_per_task,
        num_generations=recipe.samples_per_task,
        gradient_accumulation_steps=1,
        max_steps=recipe.max_steps,
        learning_rate=recipe.learning_rate,
        warmup_steps=recipe.warmup_steps,
        lr_scheduler_type=recipe.lr_scheduler_type,
        beta=recipe.beta,
        loss_type=recipe.loss_type,
        gradient_checkpointing=recipe.gradient_checkpointing,
        temperature=recipe.rollout.temperature,
        max_completion_length=recipe.max_completion_length,
        seed=recipe.seed,
        data_seed=recipe.seed,
        logging_steps=recipe.logging_steps,
        save_strategy="no",
        report_to="none",
        use_cpu=on_cpu(recipe),
        bf16=False,
        disable_tqdm=recipe.quiet,
        log_level="warning" if recipe.quiet else "passive",
        **vllm,
    ), recipe.trl, owned=("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_server_base_url"))
