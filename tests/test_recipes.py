"""Every shipped recipe starts with the command that runs it, comments its keys and loads into its config."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from omrl.config import RecipeError, describe, load_recipe, parse_overrides, read_yaml

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TRAINING = sorted(p for p in RECIPES.glob("*.yaml") if not p.name.startswith("reward"))
ACCELERATE = sorted((RECIPES / "accelerate").glob("*.yaml"))


def config_class(command: str):
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.config.rft import RFTRecipe
    from omrl.train.config.sft import SFTRecipe

    for verb, cls in (("sft", SFTRecipe), ("grpo", GRPORecipe), ("rft", RFTRecipe), ("iterate", IterateRecipe)):
        if re.search(rf"omrl train {verb}\b", command):
            return cls
    return None


@pytest.mark.parametrize("path", TRAINING + ACCELERATE, ids=lambda p: p.name)
def test_recipe_starts_with_its_command_and_comments_keys(path):
    lines = path.read_text().splitlines()
    header = []
    for line in lines:  # the leading comment block must name the command that runs the recipe
        if not line.startswith("#"):
            break
        header.append(line)
    assert header and re.search(r"\b(omrl \w+|make \w+|accelerate launch)\b", "\n".join(header)), lines[0]
    if path in ACCELERATE or config_class(lines[0]) is not None:
        for line in lines:
            if re.match(r"^\s*[\w.]+:", line):
                assert "#" in line, f"{path.name}: key without a comment: {line!r}"


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_training_recipe_loads_into_its_config(path):
    pytest.importorskip("trl")
    command = path.read_text().splitlines()[0]
    cls = config_class(command)
    if cls is None:
        pytest.skip(f"{path.name} is run by {command!r}, not by omrl train (validated by its own command)")
    config = load_recipe(path, cls)
    assert config is not None


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs_are_valid_yaml(path):
    data = yaml.safe_load(path.read_text())
    assert data["distributed_type"] in ("MULTI_GPU", "FSDP", "DEEPSPEED", "MULTI_CPU")
    assert data["num_processes"] >= 1


def test_overrides_convert_types_and_nest():
    from omrl.train.config.sft import SFTRecipe

    config = load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe,
                         ["learning_rate=1e-4", "lora.r=4", "lora.enabled=true", "where=reward > 0.5",
                          "use_cpu=yes", "lora.target_modules=q_proj,v_proj"])
    assert config.learning_rate == 1e-4 and isinstance(config.learning_rate, float)
    assert config.lora.r == 4 and config.lora.enabled is True and config.use_cpu is True
    assert config.where == "reward > 0.5" and config.lora.target_modules == ["q_proj", "v_proj"]
    assert parse_overrides(["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}


def test_unknown_and_bad_keys_are_named():
    from omrl.train.config.sft import SFTRecipe

    with pytest.raises(RecipeError, match="unknown key learnin_rate"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["learnin_rate=1"])
    with pytest.raises(RecipeError, match="unknown key lora.rank"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["lora.rank=1"])
    with pytest.raises(RecipeError, match="epochs must be int, not .two."):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["epochs=two"])
    with pytest.raises(RecipeError, match="missing required key output_dir"):
        load_recipe({"model": "m", "store": "s"}, SFTRecipe)
    with pytest.raises(RecipeError, match="batching must be"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["batching=fast"])
    with pytest.raises(RecipeError, match="not key=value"):
        parse_overrides(["epochs"])


def test_every_setting_has_help():
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.config.rft import RFTRecipe
    from omrl.train.config.sft import SFTRecipe

    for cls in (SFTRecipe, GRPORecipe, RFTRecipe, IterateRecipe):
        for key, _default, text in describe(cls):
            assert text, f"{cls.__name__}.{key} has no help"


def test_train_cli_prints_resolved_config():
    from click.testing import CliRunner

    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["train", "sft", "--recipe", str(RECIPES / "sft_tiny.yaml"), "--print-config",
                                      "epochs=2"])
    assert result.exit_code == 0, result.output
    assert '"epochs": 2' in result.output
    result = CliRunner().invoke(cli, ["train", "sft", "--recipe", str(RECIPES / "sft_tiny.yaml"), "bogus=1"])
    assert result.exit_code != 0 and "unknown key bogus" in result.output


def test_rollout_settings_are_a_section_of_every_training_recipe():
    pytest.importorskip("trl")
    from omrl.rollout import RolloutSettings
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.config.rft import RFTRecipe

    for name, cls in (("grpo_grid", GRPORecipe), ("rft_grid", RFTRecipe), ("iterate_grid", IterateRecipe)):
        config = load_recipe(RECIPES / f"{name}.yaml", cls, ["rollout.max_turns=4", "rollout.env_options.noise=0"])
        assert isinstance(config.rollout, RolloutSettings)
        assert config.rollout.max_turns == 4 and config.rollout.env_options == {"noise": 0}
        assert config.rollout.max_new_tokens == 8  # the rest as the file says
        assert {k for k, _, _ in describe(cls)} >= {f"rollout.{k}" for k in ("env", "max_turns", "seed")}


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_training_recipe_names_its_data_so_it_runs_from_any_folder(path, tmp_path, monkeypatch):
    """Task sets and rubrics are shipped names, not paths relative to a checkout (omrl demo from a wheel)."""
    from omrl.annotate.rubric import load_rubric
    from omrl.tasks import load_tasks

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(path.read_text())
    sources = [data[key] for key in ("tasks", "train_tasks", "eval_tasks") if data.get(key)]
    rubrics = re.findall(r"rubric:\s*(\S+)", path.read_text())
    for source in sources:
        assert str(source).startswith("shipped:") and load_tasks(source), (path.name, source)
    for rubric in rubrics:
        assert rubric.startswith("shipped:") and load_rubric(rubric).criteria, (path.name, rubric)


def test_shipped_recipes_resolve_by_name_only():
    from omrl.shipped import resolve_recipe, shipped_recipes

    names = shipped_recipes()
    assert {"quickstart", "sft_tiny", "judges/grid_goal", "accelerate/ddp"} <= set(names)
    assert Path(resolve_recipe("shipped:quickstart")).resolve() == RECIPES / "quickstart.yaml"
    assert Path(resolve_recipe("shipped:judges/grid_goal.yaml")).resolve() == RECIPES / "judges" / "grid_goal.yaml"
    assert resolve_recipe("my.yaml") == "my.yaml"
    for bad in ("shipped:nope", "shipped:../pyproject", "shipped:/etc/passwd", "shipped:"):
        with pytest.raises(FileNotFoundError, match="shipped:quickstart"):
            resolve_recipe(bad)
    from omrl.train.config.iterate import IterateRecipe

    assert load_recipe("shipped:quickstart", IterateRecipe) == load_recipe(RECIPES / "quickstart.yaml", IterateRecipe)


def test_recipes_cli_lists_and_copies(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    listed = runner.invoke(cli, ["recipes", "list"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert "quickstart" in listed.output and "judges/grid_goal" in listed.output
    assert "The learning demo" in listed.output  # quickstart's first comment line

    copied = runner.invoke(cli, ["recipes", "copy", "quickstart"])
    assert copied.exit_code == 0, copied.output
    assert (tmp_path / "quickstart.yaml").read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    again = runner.invoke(cli, ["recipes", "copy", "quickstart"])
    assert again.exit_code == 1 and "--force" in again.output
    (tmp_path / "mine").mkdir()
    into = runner.invoke(cli, ["recipes", "copy", "shipped:judges/grid_goal", "mine", "--force"])
    assert into.exit_code == 0 and (tmp_path / "mine" / "grid_goal.yaml").is_file(), into.output
    unknown = runner.invoke(cli, ["recipes", "copy", "quickstrat"])
    assert unknown.exit_code == 1 and "shipped:quickstart" in unknown.output


def _shipped_values() -> dict[str, tuple]:
    """Every shipped recipe outside accelerate/: its loader, and a few values it must resolve to."""
    from omrl.annotate.reward import load_reward_recipe
    from omrl.annotate.rubric import load_rubric
    from omrl.formats.mapping import load_mapping
    from omrl.study.spec import load_study
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.config.ppo import PPORecipe
    from omrl.train.config.rft import RFTRecipe
    from omrl.train.config.sft import SFTRecipe

    def config(cls):
        return lambda path: load_recipe(path, cls)

    iterate = config(IterateRecipe)
    return {
        "quickstart.yaml": (iterate, lambda r: (
            r.rounds, r.rollout.env, r.rollout.env_options, r.rollout.max_turns, r.rollout.max_new_tokens,
            r.rollout.concurrency, r.tiny.hidden, r.tiny.vocab_size, r.sft.epochs, r.sft.lr_scheduler_type,
            r.grpo.max_steps, r.grpo.learning_rate, r.grpo.max_completion_length, r.eval.tasks,
            r.baseline.more_sft_epochs),
            (2, "grid", {"noise": 0.3, "seed": 0}, 14, 4, 64, 128, 1024, 8, "cosine", 30, 2e-4, 160, 200, 9)),
        "hard_grid.yaml": (iterate, lambda r: (r.rounds, r.rollout.max_turns, r.grpo.logging_steps, r.ppo.level),
                           (1, 17, 5, "turn")),
        "iterate_grid.yaml": (iterate, lambda r: (r.rollout.max_new_tokens, r.collect.samples, r.filter.drop_flat,
                                                  r.grpo.warmup_steps, r.sft.epochs), (8, 8, True, 20, 10)),
        "judge_grid.yaml": (iterate, lambda r: (r.model, r.demos.enabled, r.grpo.reward["components"]["env_reward"],
                                                r.grpo.reward["judges"][0]["mode"]),
                            ("runs/quickstart/sft", False, 0.0, "group")),
        "textworld_coin.yaml": (iterate, lambda r: (r.rollout.env, r.rollout.concurrency, r.tiny.corpus,
                                                    r.sft.max_length, r.grpo.tasks_per_step),
                                ("twx", 32, "demos", 2048, 4)),
        "grpo_grid.yaml": (config(GRPORecipe), lambda r: (r.rollout.max_new_tokens, r.rollout.concurrency,
                                                          r.learning_rate, r.loss_type, r.max_completion_length),
                           (8, 64, 5e-4, "dapo", 160)),
        "ppo_grid.yaml": (config(PPORecipe), lambda r: (r.level, r.warmup_steps, r.rollout.max_turns, r.critic),
                          ("turn", 10, 14, "head")),
        "rft_grid.yaml": (config(RFTRecipe), lambda r: (r.samples, r.rollout.max_new_tokens, r.sft.epochs,
                                                        r.sft.learning_rate), (8, 8, 3, 5e-4)),
        "sft_tiny.yaml": (config(SFTRecipe), lambda r: (r.where, r.epochs, r.batch_size, r.lora.r, r.lora.enabled),
                          ("success", 10, 32, 16, False)),
        "sft_real.yaml": (config(SFTRecipe), lambda r: (r.model, r.epochs, r.learning_rate, r.lora.enabled,
                                                        r.lora.target_modules, r.lora.merge),
                          ("hf:smollm2-135m-instruct", 3, 1e-3, True, ["all-linear"], True)),
        "grpo_real.yaml": (config(GRPORecipe), lambda r: (r.model, r.rollout.env, r.max_steps, r.learning_rate,
                                                          r.lora.enabled, r.lora.merge),
                           ("real-sft", "grid", 10, 1e-4, True, True)),
        "reward.yaml": (load_reward_recipe, lambda r: (
            [(c.name, c.weight, c.scale) for c in r.components], r.missing, r.metrics, r.judges[0]["model"]),
            ([("env_reward", 1.0, None), ("exact_match", 0.5, None), ("judge:task_quality", 0.25, (1.0, 10.0))],
             "null", ["exact_match"], "$OMRL_JUDGE_MODEL")),
        "reward_offline.yaml": (load_reward_recipe, lambda r: (
            [(c.name, c.weight, c.scale) for c in r.components], r.missing, r.metrics, r.judges),
            ([("env_reward", 1.0, None), ("exact_match", 0.5, None)], "null", ["exact_match"], [])),
        "judges/correctness.yaml": (load_rubric, lambda r: (r.scale_min, r.scale_max, r.annotator),
                                    (0.0, 1.0, "judge:correctness")),
        "judges/grid_goal.yaml": (load_rubric, lambda r: (r.scale_min, r.scale_max, r.annotator, len(r.criteria)),
                                  (0.0, 10.0, "judge:grid_goal", 2)),
        "judges/grid_reached.yaml": (load_rubric, lambda r: (r.scale_min, r.scale_max, r.annotator),
                                     (0.0, 10.0, "judge:grid_reached")),
        "judges/task_quality.yaml": (load_rubric, lambda r: (r.scale_min, r.scale_max, r.annotator, len(r.examples)),
                                     (1.0, 10.0, "judge:task_quality", 1)),
        "imports/tau_bench.yaml": (load_mapping, lambda m: (m.messages, m.id, m.task, m.name, m.content),
                                   ("traj", "task_id", ("info.task", "info.reward_info"), "tau_bench", ())),
        "imports/chat_with_tools.yaml": (load_mapping, lambda m: (m.messages, m.model, m.success, m.name),
                                         ("conversation", ("meta.model", "model"), "result.solved", "mapped")),
        "studies/grid.yaml": (load_study, lambda s: (s.env, s.tasks.test, [m.kind for m in s.methods], s.seeds,
                                                     s.budget.unit, s.primary.a, s.primary.condition),
                              ("grid", "shipped:grid_eval[100:]", ["sft", "more_sft", "rft", "grpo", "step_credit"],
                               5, "optimizer_steps", "best_rl_on_dev", "noisy")),
        "studies/coin.yaml": (load_study, lambda s: (s.recipe, s.env_options, s.tasks.test, s.budget.value, s.seeds,
                                                     [c.name for c in s.conditions], s.primary.condition,
                                                     s.drop_overlaps),
                              ("shipped:textworld_coin", {"action_format": "text", "observation": "brief",
                                                          "show_tried": True}, "shipped:twx_coin6_test", 64, 5,
                               ["detours", "gold", "few_demos"], "detours", True)),
        "studies/coin_quick.yaml": (load_study, lambda s: (s.recipe, s.tasks.test, [m.kind for m in s.methods],
                                                           s.budget.value, [c.name for c in s.conditions],
                                                           s.primary.condition),
                                    ("shipped:textworld_coin", "shipped:twx_coin6_test[:6]",
                                     ["sft", "more_sft", "rft", "grpo", "step_credit", "ppo_turn"], 2,
                                     ["detours", "few_demos"], "detours")),
        "studies/real_grid.yaml": (load_study, lambda s: (s.recipe, [(m.kind, m.start) for m in s.methods], s.seeds,
                                                          s.primary.a, s.primary.b),
                                   ("shipped:iterate_real", [("base", "sft"), ("sft", "sft"), ("grpo", "sft"),
                                                             ("grpo", "base")], 3, "grpo", "base")),
        "iterate_real.yaml": (iterate, lambda r: (r.model, r.sft.lora.enabled, r.grpo.lora.enabled, r.demos.tasks,
                                                  r.demos.only_success),
                              ("hf:smollm2-135m-instruct", True, True, 64, True)),
        "studies/quick.yaml": (load_study, lambda s: (s.env, s.tasks.test, [m.kind for m in s.methods], s.seeds,
                                                      s.budget.value, s.primary.a, s.primary.b),
                               ("grid", "shipped:grid_eval[100:116]", ["sft", "more_sft", "grpo"], 2, 10,
                                "best_rl_on_dev", "more_sft")),
    }


def test_every_shipped_recipe_loads_to_the_values_it_states():
    """Each recipe in recipes/ (accelerate/ aside) through the one loader, a few resolved values checked; a new
    recipe must be added here."""
    pytest.importorskip("trl")
    expected = _shipped_values()
    shipped = {str(p.relative_to(RECIPES)) for p in RECIPES.rglob("*.yaml") if p.parent.name != "accelerate"}
    assert shipped == set(expected)
    for name, (load, values, wanted) in expected.items():
        assert values(load(RECIPES / name)) == wanted, name


def test_quickstart_hands_trl_the_same_config_values():
    """The demo's GRPO round and SFT stage reach TRL with the values the recipe has always given it."""
    pytest.importorskip("trl")
    from omrl.train.config.grpo import trl_config as grpo_trl_config
    from omrl.train.config.iterate import IterateRecipe, grpo_recipe
    from omrl.train.config.sft import trl_config

    recipe = load_recipe(RECIPES / "quickstart.yaml", IterateRecipe)
    grpo = grpo_trl_config(grpo_recipe(recipe, {"model": "m", "tasks": "t", "output_dir": "o"}, round=1))
    assert (grpo.learning_rate, grpo.warmup_steps, grpo.lr_scheduler_type, grpo.beta, grpo.loss_type,
            grpo.temperature, grpo.max_completion_length, grpo.per_device_train_batch_size, grpo.num_generations,
            grpo.max_steps, grpo.seed, grpo.logging_steps) == (
        2e-4, 5, "constant_with_warmup", 0.0, "dapo", 1.0, 160, 64, 8, 30, 1, 5)
    sft = trl_config(recipe.sft.to_recipe(model="m", store="s", output_dir="o", where=None, seed=1))
    assert (sft.learning_rate, sft.num_train_epochs, sft.per_device_train_batch_size, sft.lr_scheduler_type,
            sft.warmup_steps, sft.max_length, sft.seed) == (1e-3, 8, 32, "cosine", 10, 1024, 1)


def test_one_loader_names_file_and_dotted_key(tmp_path):
    from omrl.annotate.reward import load_reward_recipe
    from omrl.errors import UsageError

    assert issubclass(RecipeError, UsageError)
    path = tmp_path / "r.yaml"
    path.write_text("components:\n  judge:q: {weight: 0.5, scale: [10, 1]}\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: components\.judge:q: .*scale must be \[min, max\]"):
        load_reward_recipe(path)
    path.write_text("components:\n  judge:q: {weight: 0.5, scale: [1, 2, 3]}\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: components\.judge:q\.scale must be a list of 2 items"):
        load_reward_recipe(path)
    path.write_text("components: {env_reward: 1}\njudges: [{rubric: {name: q, criteria: [c], scale: {min: 0, max: 1},"
                    " bogus: 1}, model: m, base_url: http://x/v1}]\n")
    from omrl.annotate.runner import recipe_judges

    with pytest.raises(RecipeError, match=r"r\.yaml \(inline rubric of judges\[0\]\): unknown key bogus"):
        recipe_judges(load_reward_recipe(path))
    path.write_text("components: {env_reward: 1}\njudges: [{rubric: shipped:judges/grid_goal, model: m, "
                    "base_url: http://x/v1, max_tokens: lots}]\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: judges\[0\]\.max_tokens must be int, not 'lots'"):
        recipe_judges(load_reward_recipe(path))
    path.write_text("components: {env_reward: 1}\njudges: [{rubric: shipped:judges/grid_goal, model: m, "
                    "base_url: http://x/v1, api_key: sk-secret}]\n")
    with pytest.raises(RecipeError, match=r"judges\[0\]\.api_key: the key is never written in a recipe"):
        recipe_judges(load_reward_recipe(path))
    path.write_text("rounds: [2\n")
    with pytest.raises(RecipeError, match=r"r\.yaml line 2: not valid YAML"):
        read_yaml(path)


def test_the_trl_section_is_passed_to_trl_and_checked_at_load_time():
    pytest.importorskip("trl")
    from omrl.train.config.grpo import trl_config as grpo_trl_config
    from omrl.train.config.iterate import IterateRecipe, grpo_recipe
    from omrl.train.config.sft import SFTRecipe, trl_config

    sft = load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["trl.max_grad_norm=0.5", "trl.adam_beta2=0.99"])
    config = trl_config(sft)
    assert (config.max_grad_norm, config.adam_beta2, config.learning_rate) == (0.5, 0.99, 1e-3)
    assert trl_config(load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe)).max_grad_norm == 1.0  # TRL's own default
    with pytest.raises(RecipeError, match=r"sft_tiny\.yaml: trl\.max_grad_nrom is not a setting of SFTConfig"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["trl.max_grad_nrom=0.5"])
    with pytest.raises(RecipeError, match=r"trl\.learning_rate: omrl sets SFTConfig\.learning_rate"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["trl.learning_rate=0.1"])
    # In an iterate recipe's grpo section too, refused when the recipe loads (not after the SFT stage).
    with pytest.raises(RecipeError, match=r"quickstart\.yaml: grpo: trl\.bogus is not a setting of GRPOConfig"):
        load_recipe(RECIPES / "quickstart.yaml", IterateRecipe, ["grpo.trl.bogus=1"])
    with pytest.raises(RecipeError, match=r"trl\.use_vllm: omrl sets GRPOConfig\.use_vllm"):
        load_recipe(RECIPES / "quickstart.yaml", IterateRecipe, ["grpo.trl.use_vllm=true"])
    recipe = load_recipe(RECIPES / "quickstart.yaml", IterateRecipe, ["grpo.trl.max_grad_norm=0.25"])
    grpo = grpo_trl_config(grpo_recipe(recipe, {"model": "m", "tasks": "t", "output_dir": "o"}, round=1))
    assert (grpo.max_grad_norm, grpo.learning_rate, grpo.loss_type) == (0.25, 2e-4, "dapo")


@dataclass
class Inner:  # module level: the loader resolves the annotations in the module's names
    mode: Literal["fast", "slow"] = "fast"


@dataclass
class Settings:
    level: Literal["token", "turn"] = "token"
    width: Literal[1, 2] | None = None
    inner: Inner = field(default_factory=Inner)


def test_a_literal_setting_takes_only_its_values_from_a_file_a_mapping_or_an_override(tmp_path):
    from omrl.annotate.reward import load_reward_recipe
    from omrl.config import from_dict

    assert from_dict(Settings, {"level": "turn", "width": 2, "inner": {"mode": "slow"}}) == \
        Settings("turn", 2, Inner("slow"))
    assert from_dict(Settings, {"width": None}).width is None
    path = tmp_path / "s.yaml"
    path.write_text("level: turn  # the file's value\n")
    assert load_recipe(path, Settings).level == "turn"
    assert load_recipe(path, Settings, ["level=token", "inner.mode=slow"]) == Settings("token", None, Inner("slow"))
    with pytest.raises(RecipeError, match=r"s\.yaml: level must be one of token, turn, not 'episode'"):
        load_recipe(path, Settings, ["level=episode"])
    path.write_text("inner: {mode: medium}\n")
    with pytest.raises(RecipeError, match=r"s\.yaml: inner\.mode must be one of fast, slow, not 'medium'"):
        load_recipe(path, Settings)
    with pytest.raises(RecipeError, match="width must be one of 1, 2, not 3"):
        from_dict(Settings, {"width": 3})
    with pytest.raises(RecipeError, match="width must be one of 1, 2, not '1'"):  # text is not the number
        from_dict(Settings, {"width": "1"})
    with pytest.raises(RecipeError, match="level must be one of token, turn, not True"):
        from_dict(Settings, {"level": True})
    # a library recipe's Literal key: the reward recipe's `missing`
    assert load_reward_recipe({"components": {"env_reward": 1.0}, "missing": None}).missing == "null"
    with pytest.raises(RecipeError, match="missing must be one of null, renormalize, not 'skip'"):
        load_reward_recipe({"components": {"env_reward": 1.0}, "missing": "skip"})
