"""LoRA for every trainer (GRPO, PPO, RFT; SFT in test_sft), `omrl models merge`, and the memory options:
the adapter is saved beside the checkpoint, the base weights never move, a merged model scores as the peft one."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from click.testing import CliRunner  # noqa: E402

from omrl.cli.main import cli  # noqa: E402
from omrl.envs.base import Task  # noqa: E402
from omrl.rollout import RolloutSettings  # noqa: E402
from omrl.tasks import write_tasks  # noqa: E402
from omrl.train.config.base import LoraSettings  # noqa: E402
from tests.train_helpers import random_mover_model  # noqa: E402

LORA = {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}


def _logits(model, tokenizer, text="say something"):
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return model(ids).logits.float()


def check_adapter_run(base, out):
    """The run saved an adapter that moved (lora_B left zero) while the base weights stayed as they were; the
    trainer's merged checkpoint, `omrl models merge` of the adapter and the peft model score alike."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.models.adapters import load_adapter

    adapter = out / "adapter"
    weights = load_file(adapter / "adapter_model.safetensors")
    assert weights and all("lora_" in k for k in weights)  # the adapter alone, no base weight copied
    assert any(float(w.abs().max()) > 0 for k, w in weights.items() if "lora_B" in k)  # it trained (B starts 0)
    original, merged = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    adapted = {k.split("base_model.model.", 1)[1].replace(".lora_A.weight", ".weight")
               for k in weights if "lora_A" in k}
    untouched = [k for k in original if k not in adapted]
    assert untouched and all(torch.equal(original[k], merged[k]) for k in untouched)  # embeddings, norms, ...
    assert any(not torch.equal(original[k], merged[k]) for k in adapted)  # the merged adapters moved these
    cli_out = out.parent / f"{out.name}-merged"
    result = CliRunner().invoke(cli, ["models", "merge", str(adapter), "--out", str(cli_out)])
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(cli_out)
    peft_logits = _logits(load_adapter(adapter), tokenizer)
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(cli_out).eval(), tokenizer), peft_logits,
                          atol=1e-5)
    # the base checkpoint + the adapter is exactly what training left: its merge equals the trainer's
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(out).eval(), tokenizer), peft_logits,
                          atol=1e-5)
    assert not torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(base).eval(), tokenizer), peft_logits,
                              atol=1e-5)


@pytest.mark.slow
def test_lora_grpo_trains_only_the_adapter_and_merges_to_the_peft_model_s_logits(tmp_path):
    from omrl.models.tiny import build_tiny_model
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.config.grpo import GRPORecipe

    base = build_tiny_model(tmp_path / "tiny", hidden=64, layers=2)
    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(4)],
                        tmp_path / "tasks.jsonl")
    recipe = GRPORecipe(model=str(base), tasks=str(tasks), output_dir=str(tmp_path / "out"),
                        rollout=RolloutSettings(env="test_grpo:LetterEnv", max_turns=1, max_new_tokens=12),
                        max_steps=2, tasks_per_step=2, samples_per_task=4, warmup_steps=0, learning_rate=5e-2,
                        logging_steps=1, quiet=True, lora=LoraSettings(**LORA))
    result = train_grpo(recipe)
    assert result.steps == 2 and json.loads((result.checkpoint / "adapter" / "adapter_config.json").read_text())["r"] == 4
    check_adapter_run(base, result.checkpoint)


@pytest.mark.slow
def test_lora_ppo_with_checkpointing_and_chunked_logprobs_trains_only_the_adapter(tmp_path):
    from omrl.train.algorithms.ppo import train_ppo
    from omrl.train.config.ppo import PPORecipe

    base = random_mover_model(tmp_path / "mover")
    tasks = write_tasks([Task(id=f"g{x}", instruction="Reach the goal.", env="grid",
                              payload={"size": 7, "start": [x, 3], "goal": [x - 1, 3]}) for x in range(2, 6)],
                        tmp_path / "tasks.jsonl")
    result = train_ppo(PPORecipe(
        model=str(base), tasks=str(tasks), output_dir=str(tmp_path / "out"),
        rollout=RolloutSettings(env="grid", max_turns=1, max_new_tokens=4), max_steps=2, tasks_per_step=2,
        samples_per_task=4, ppo_epochs=1, minibatches=1, learning_rate=5e-2, quiet=True, lora=LoraSettings(**LORA),
        gradient_checkpointing=True, logprob_chunk=3))
    assert len(result.history) == 2 and all(e["logprob_gap"] < 1e-4 for e in result.history)
    assert (result.checkpoint / "critic" / "value_head.safetensors").is_file()
    check_adapter_run(base, result.checkpoint)


@pytest.mark.slow
def test_lora_rft_fine_tunes_an_adapter_on_the_kept_attempts(tmp_path):
    from omrl.envs.grid import grid_tasks
    from omrl.train.algorithms.rft import train_rft

    base = random_mover_model(tmp_path / "mover")
    tasks = [t for t in grid_tasks(100, seed=2)
             if sum(abs(a - b) for a, b in zip(t.payload["start"], t.payload["goal"], strict=True)) == 2][:4]
    result = train_rft({"model": str(base), "tasks": str(write_tasks(tasks, tmp_path / "tasks.parquet")),
                        "output_dir": str(tmp_path / "rft"), "samples": 12, "threshold": 0.5,
                        "rollout": {"env": "grid", "max_turns": 4, "max_new_tokens": 4},
                        "sft": {"epochs": 2, "batch_size": 4, "learning_rate": 5e-2, "quiet": True, "lora": LORA}})
    assert result.rollouts["kept"] > 0
    check_adapter_run(base, result.checkpoint)


def test_chunked_logprobs_equal_the_full_logits_ones_with_their_gradients(tmp_path):
    from transformers import AutoModelForCausalLM

    from omrl.models.tiny import cached_tiny_model
    from omrl.train.rl.ppo_update import forward

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(cached_tiny_model()).eval()
    ids = torch.randint(0, model.config.vocab_size, (3, 11))
    att = torch.ones_like(ids)
    att[0, :2] = 0  # a left-padded prompt
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    width, completion = 4, ids[:, 4:]
    results = []
    for chunk in (0, 5):
        model.zero_grad()
        logp, entropy, _ = forward(model, None, ids, att, pos, completion, width, 0.7, with_values=False,
                                   chunk=chunk)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        results.append((logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logp_a, ent_a, grad_a), (logp_b, ent_b, grad_b) = results
    assert logp_a.shape == completion.shape and torch.allclose(logp_a, logp_b, atol=1e-5)
    assert torch.allclose(ent_a, ent_b, atol=1e-5)
    assert all(torch.allclose(grad_a[n], grad_b[n], atol=1e-5) for n in grad_a)


def test_ppo_layer_checkpointing_keeps_the_gradients_and_the_eval_mode():
    from transformers import AutoModelForCausalLM

    from omrl.models.tiny import cached_tiny_model
    from omrl.train.rl.ppo_update import checkpoint_layers

    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    grads, calls = [], []
    for checkpointed in (False, True):
        model = AutoModelForCausalLM.from_pretrained(cached_tiny_model()).eval()
        if checkpointed:
            checkpoint_layers(model)
            assert not any(m.training for name, m in model.named_modules() if name.endswith("self_attn"))
        seen = []
        model.model.layers[0].self_attn.register_forward_hook(lambda *_, seen=seen: seen.append(1))
        model(ids).logits.logsumexp(-1).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        calls.append(len(seen))
    assert calls == [1, 2]  # checkpointed: the layer runs again in the backward pass
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


@pytest.mark.parametrize("trainer", ["sft", "grpo", "ppo", "rft"])
def test_a_recipe_with_lora_loads_and_shows_in_print_config(trainer):
    section = "sft.lora" if trainer == "rft" else "lora"
    recipe = {"sft": "recipes/sft_tiny.yaml", "grpo": "recipes/grpo_grid.yaml", "ppo": "recipes/ppo_grid.yaml",
              "rft": "recipes/rft_grid.yaml"}[trainer]
    result = CliRunner().invoke(cli, ["train", trainer, "--recipe", recipe, f"{section}.enabled=true",
                                      f"{section}.r=8", f"{section}.target_modules=q_proj,v_proj",
                                      "--print-config"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.output)
    lora = config["sft"]["lora"] if trainer == "rft" else config["lora"]
    assert lora == {"enabled": True, "r": 8, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"],
                    "merge": True}
    settings = config["sft"] if trainer == "rft" else config
    assert settings["gradient_checkpointing"] is (trainer != "ppo")  # TRL's default; PPO's own loop: off
