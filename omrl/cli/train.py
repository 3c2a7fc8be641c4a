"""`omrl train sft|grpo|ppo|rft|iterate`: run a training recipe (YAML) with optional key=value overrides."""

from __future__ import annotations

import json

import click

from omrl.cli.common import console, user_errors


def _load(recipe: str | None, overrides: tuple[str, ...], cls: type):
    from omrl.recipes import load_recipe

    return load_recipe(recipe, cls, overrides)


def _recipe_options(func):
    func = click.argument("overrides", nargs=-1)(func)
    func = click.option("--recipe", "-r", type=click.Path(dir_okay=False), default=None,
                        help="YAML recipe, or shipped:NAME (omrl recipes list); key=value arguments override its keys "
                             "(dots for sections).")(func)
    func = click.option("--print-config", is_flag=True, help="Print the resolved settings and exit.")(func)
    func = click.option("--verbose", is_flag=True,
                        help="TRL's own logs, bars and warnings instead of the training view.")(func)
    return func


def _view(verbose: bool, title: str):
    """The rich training view (stage, step, loss/reward, time left) every trainer reports to."""
    from omrl.train.console import training_view

    return training_view(verbose=verbose, title=title)


def _print_config(config) -> None:
    from omrl.recipes import to_dict

    console.print_json(json.dumps(to_dict(config), default=str))


@click.group()
def train() -> None:
    """Train on stored experience: sft, grpo, ppo, rft (rejection sampling), iterate (rounds of all).

    Example:  omrl train sft --recipe recipes/sft_tiny.yaml epochs=3
    """


@train.command("sft")
@_recipe_options
@user_errors
def sft(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool) -> None:
    """Supervised fine-tuning (TRL SFTTrainer) on a store's trainable assistant turns.

    Example:  omrl train sft --recipe recipes/sft_tiny.yaml store=runs/demos where="success"
    """
    from omrl.train.sft import SFTRecipe, train_sft

    config = _load(recipe, overrides, SFTRecipe)
    if print_config:
        return _print_config(config)
    with _view(verbose, "sft") as view, view.stage("sft", f"-> {config.output_dir}"):
        result = train_sft(config)
    console.print(f"bridge: {_summary(result.report)}")
    console.print(f"final loss {result.losses[-1] if result.losses else float('nan'):.4f}; "
                  f"checkpoint [bold]{result.checkpoint}[/bold]")


@train.command("grpo")
@_recipe_options
@user_errors
def grpo(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool) -> None:
    """GRPO (TRL GRPOTrainer) on a tasks file, rollouts by omrl's agent loop, groups written to the store.

    With reward=RECIPE (a reward recipe, as `omrl annotate --reward-recipe`) its metrics and judges score
    each group online and every score is stored.

    Example:  omrl train grpo --recipe recipes/grpo_grid.yaml max_steps=50 [reward=recipes/reward.yaml]
    """
    from omrl.train.grpo import GRPORecipe, train_grpo

    config = _load(recipe, overrides, GRPORecipe)
    if print_config:
        return _print_config(config)
    with _view(verbose, "grpo") as view, view.stage("grpo", f"-> {config.output_dir}"):
        checkpoint = train_grpo(config)
    if config.reward is not None:
        console.print(_reward_summary(checkpoint / "omrl_grpo.json"))
    console.print(f"checkpoint [bold]{checkpoint}[/bold]")


@train.command("ppo")
@_recipe_options
@user_errors
def ppo(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool = False) -> None:
    """PPO for multi-turn agents: a critic, GAE over tokens or turns (env tokens skipped), rollouts stored.

    Example:  omrl train ppo --recipe recipes/ppo_grid.yaml level=turn max_steps=20
    """
    from omrl.train.ppo import PPORecipe, train_ppo

    config = _load(recipe, overrides, PPORecipe)
    if print_config:
        return _print_config(config)
    result = train_ppo(config)
    if not result.main:  # several processes: the main one reports for all of them
        return
    last = result.log[-1] if result.log else {}
    console.print(f"{len(result.log)} steps, {result.stored} rollouts stored; last reward {last.get('reward')}, "
                  f"success {last.get('success')}; checkpoint [bold]{result.checkpoint}[/bold]")


@train.command("rft")
@_recipe_options
@user_errors
def rft(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool) -> None:
    """Rejection-sampling fine-tuning: N attempts per task, [annotate,] keep the best above a threshold, SFT.

    With reward_recipe=RECIPE the attempts are first annotated by its metrics and judges and ranked by its
    combined reward.

    Example:  omrl train rft --recipe recipes/rft_grid.yaml samples=8 threshold=1.0
    """
    from omrl.train.rft import RFTRecipe, train_rft

    config = _load(recipe, overrides, RFTRecipe)
    if print_config:
        return _print_config(config)
    with _view(verbose, "rft") as view, view.stage("rft", f"-> {config.output_dir}"):
        result = train_rft(config)
    console.print(f"{result.attempts} attempts (success {result.success_rate}), kept {result.kept}; "
                  f"checkpoint [bold]{result.checkpoint}[/bold]")


@train.command("iterate")
@_recipe_options
@user_errors
def iterate(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool) -> None:
    """Iterative rounds: collect -> [annotate ->] filter -> GRPO (-> SFT on best) -> held-out eval; resumes.

    With reward=RECIPE each round's collection is annotated by its metrics and judges, the filter ranks by
    it and GRPO is scored online by it.

    Example:  omrl train iterate --recipe recipes/iterate_grid.yaml rounds=2 [reward=recipes/reward.yaml]
    """
    from omrl.train.iterate import IterateRecipe, round_table, run_iterate

    config = _load(recipe, overrides, IterateRecipe)
    if print_config:
        return _print_config(config)
    with _view(verbose, "iterate") as view:
        results = run_iterate(config, view=view)
    console.print(round_table(results))
    console.print(f"results: {config.output_dir}/results.json")


def _reward_summary(record_path) -> str:
    """One line on a GRPO run's online reward: scored, dropped, missing components, judge calls and cost."""
    import json

    summary = json.loads(record_path.read_text()).get("reward_summary") or {}
    judges = "; ".join(f"{name}: {j['calls']} calls, {j['cache_hits']} cached, "
                       f"{j['prompt_tokens'] + j['completion_tokens']} tokens"
                       + (f", ${j['cost_usd']:.4f}" if j.get("cost_usd") is not None else "")
                       for name, j in (summary.get("judges") or {}).items())
    return (f"reward: {summary.get('scored', 0)} rollouts scored, {summary.get('dropped', 0)} dropped, missing "
            f"{summary.get('missing') or 'none'}" + (f"; {judges}" if judges else ""))


def _summary(report: dict) -> str:
    from omrl.train.bridge import BridgeReport

    return BridgeReport(**report).summary()
