"""The real model (SmolLM2-135M-Instruct, `omrl models fetch`) served by a real vLLM (the CPU build, `make vllm`):
zero-shot success on every environment beside the scripted expert and random, and what serving through vLLM
gives against omrl's in-process HF policy. Prints one JSON line.

    python benchmarks/real_model.py --part zero_shot,serving          # about 20 minutes on 2 idle cores
    python benchmarks/real_model.py --part serving --n 16
    python benchmarks/real_model.py --part training                    # about 5 minutes on 2 idle cores
    nice -n 19 python benchmarks/real_model.py --part learning --study-out ~/omrl-studies/real_grid   # hours

zero_shot: per environment, --n tasks of its test split (a few), the model through vLLM started as a user
would (no tool parser: omrl's openai: policy falls back to tools as text), each episode at most
--max-turns turns; success beside the scripted expert's and random's on the same tasks, and the episodes'
statuses (an error is never a failure: it is counted apart).
serving: the same math tasks x samples collected through vLLM and through `hf:` in-process generation of the
same model: `vllm_vs_hf_collect` (episodes/s ratio); `tool_episodes_policy_error_share` (episodes of the tool
environments that ended as policy_error on vLLM's defaults: 0 expected); `token_drift_turns` (turns whose
stored completion ids are not what re-tokenising their text gives, `omrl store check --tokens`'s check);
`token_drift_trained_turns` (of those, the turns the SFT bridge trains from anything but what the server saw:
0 expected, since a turn with stored ids is trained from them).
training: one GRPO optimizer step of the model on the CPU, with LoRA and with full fine-tuning, on the same
batch (--grpo-prompts prompts x --grpo-samples completions of --completion-tokens tokens, fixed by a
rollout_func, so no generation is timed), with omrl's GRPO settings (omrl.train.config.grpo.trl_config:
gradient checkpointing, TRL's fused LM head). Each variant runs in a child process of its own so their peaks
do not mix: `lora_grpo_step_s`, `full_grpo_step_s` (the last of --grpo-steps steps: the first warms up),
`lora_grpo_peak_gb`, `full_grpo_peak_gb` (the child's peak RSS, from os.wait4's rusage), `lora_vs_full_step`
(the LoRA step's time over the full one's) and `loadavg_1m` (/proc/loadavg before the part: the machine is
shared). vLLM is started only for zero_shot and serving.
eval_engine: one iterate evaluation of the model (--eval-tasks grid tasks, one sampled and one greedy episode each, the
grid's 14-turn budget) played in this process (eval.engine hf) and served by vLLM for it (eval.engine vllm,
its start included): `eval_vllm_s`, `eval_hf_s` and `eval_hf_vs_vllm` (the in-process time over vLLM's).
lora_serving: a LoRA adapter of the model (r 16 on every linear layer, as shipped:iterate_real trains, randomly
initialised: its weights change no timing) brought into vLLM for the next round's collection both ways, then
the same --eval-tasks grid episodes played through it: merged (`omrl models merge`, then vLLM on the merged
folder) and as an adapter (vLLM on the base model with --enable-lora, the adapter by name): per way its merge,
start and play seconds, `lora_merged_s` and `lora_adapter_s` (their totals) and `lora_adapter_vs_merged` (the
adapter's total over the merged one's: above 1, merging is faster).
learning: the study shipped:studies/real_grid (omrl study run: the base model, SFT on expert demos, GRPO with
LoRA from SFT and from the base model, 3 seeds, held-out tasks screened by fingerprint and scored once through
the study's ledger), run or resumed in --study-out: per method each seed's held-out greedy and sampled success,
`grpo_vs_base_points`, `grpo_vs_sft_points` and `grpo_base_vs_base_points` (greedy, the study's primary metric:
paired two-level bootstrap over seeds and tasks, 95% interval),
the seed-level t interval of each method, `test_scorings`; `omrl report STUDY_OUT` draws it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omrl.envs import generate_tasks  # noqa: E402
from omrl.models.real import fetch  # noqa: E402
from omrl.policies import make_policy  # noqa: E402
from omrl.rollout import RolloutSettings, play_episodes  # noqa: E402
from omrl.schema import success_counts  # noqa: E402
from omrl.serve.vllm import VLLMServer  # noqa: E402
from tests.cases.hacks import REAL_OS_TASKS  # noqa: E402

MODEL = "smollm2-135m-instruct"
TOOL_ENVS = ("math", "bfcl", "miniwob", "swe", "os")  # environments whose actions are tool calls


def env_tasks(env: str, n: int, work: Path) -> list:
    """A few test tasks of `env`, made as `omrl tasks generate` makes them."""
    if env == "swe":
        from tests.cases.swe_hacks import TINYCALC, build_sdist

        return generate_tasks("swe", n=n, packages=[build_sdist(work, TINYCALC, "0.1")])
    if env == "os":
        return generate_tasks("os", n=n, split="dev", source=str(REAL_OS_TASKS))
    if env == "bfcl":
        return generate_tasks("bfcl", n=n, split="multi_turn_base")
    if env == "miniwob":
        return generate_tasks("miniwob", n=n, split="test", tasks="click-test,click-button,enter-text,focus-text")
    return generate_tasks(env, n=n, split="test")


def play(env: str, tasks: list, policy, max_turns: int, concurrency: int, samples: int = 1,
         max_new_tokens: int = 160) -> dict:
    """Play tasks x samples with `policy` through the episode runner; counts by status, success, wall time."""
    settings = RolloutSettings(env=env, max_turns=max_turns, concurrency=concurrency, max_new_tokens=max_new_tokens)
    started = time.monotonic()
    episodes = asyncio.run(play_episodes([(t, s) for t in tasks for s in range(samples)], None, policy, settings,
                                         run_id=f"real-model-{env}"))
    counts = success_counts(e.row for e in episodes)  # the one definition: solved / known outcomes
    rate = counts.rate
    return {"episodes": len(episodes), "successes": counts.solved, "success": None if rate is None else round(rate, 3),
            "statuses": dict(Counter(e.status for e in episodes)), "wall_s": round(time.monotonic() - started, 1),
            "errors": sorted({(e.row.get("error") or "")[:160] for e in episodes if e.status.endswith("error")})[:3],
            "rows": [e.row for e in episodes]}


def zero_shot(server: VLLMServer, envs: list[str], n: int, max_turns: int, work: Path) -> dict:
    """Per environment: the model through vLLM, the scripted expert and random, on the same tasks."""
    table = {}
    for env in envs:
        try:
            tasks = env_tasks(env, n, work)
        except Exception as exc:  # an environment that cannot run here is reported, never a 0
            table[env] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        # The model gets at most max_turns (each turn costs seconds on a CPU server); the expert and random
        # get the environment's own budget, so their columns say what the tasks allow.
        own = _default_turns(env)
        budget = min(max_turns, own)
        model = play(env, tasks, make_policy(f"openai:{server.served_name}", base_url=server.base_url), budget, 8)
        row = {"tasks": len(tasks), "max_turns": {"model": budget, "scripted_and_random": own},
               "model": _drop_rows(model)}
        for name in ("scripted", "random"):
            row[name] = _drop_rows(play(env, tasks, make_policy(name), own, 2))["success"]
        table[env] = row
        print(f"zero_shot {env}: {json.dumps(row)}", file=sys.stderr)
    return table


def serving(server: VLLMServer, model_dir: Path, n: int, samples: int) -> dict:
    """vLLM against in-process HF generation on the same math tasks; token drift of what vLLM returned."""
    from omrl.policies.tokens_check import check_tokens

    tasks = generate_tasks("math", n=n, split="test")
    through_vllm = play("math", tasks, make_policy(f"openai:{server.served_name}", base_url=server.base_url),
                        8, 16, samples)
    in_process = play("math", tasks, make_policy(f"hf:{model_dir}"), 8, 16, samples)
    rate = {name: run["episodes"] / run["wall_s"] for name, run in (("vllm", through_vllm), ("hf", in_process))}
    report = check_tokens(through_vllm["rows"], str(model_dir))
    return {"vllm_episodes_per_s": round(rate["vllm"], 3), "hf_episodes_per_s": round(rate["hf"], 3),
            "vllm_vs_hf_collect": round(rate["vllm"] / rate["hf"], 2),
            "vllm_statuses": through_vllm["statuses"], "hf_statuses": in_process["statuses"],
            "token_checked_turns": report.turns,
            "token_drift_turns": len({(d.trajectory_id, d.turn) for d in report.drifts}),
            "token_drift_kinds": dict(Counter(d.kind for d in report.drifts)),
            "token_drift_trained_turns": drift_trained_otherwise(through_vllm["rows"], report.drifts, model_dir)}


def drift_trained_otherwise(rows: list, drifts: list, model_dir: Path) -> int:
    """Drifting turns that the SFT bridge (omrl.train.data.bridge.sft_examples at its defaults, as `omrl train sft`
    reads a store) trains from anything but what the server saw: a turn whose trained completion is not its
    stored ids, a rendered row's drifting turn, or a trained prompt whose length is not the server's count."""
    from omrl.policies.tokens_check import load_tokenizer, sampled_completion
    from omrl.train.data.bridge import sft_examples

    tokenizer = load_tokenizer(str(model_dir))
    examples, bridge = sft_examples(rows, tokenizer)
    trained = {example["id"]: example for example in examples}
    turns = {(row["id"], turn.get("index", k)): turn for row in rows for k, turn in enumerate(row.get("turns") or [])}
    otherwise = bridge.drifting_turns_trained_from_render
    for key in sorted({(d.trajectory_id, d.turn) for d in drifts}):
        example = trained.get(f"{key[0]}#turn{key[1]}")
        if example is None:
            continue  # not trained turn by turn: a rendered row is counted by the bridge, a dropped one is not trained
        mask = example["assistant_masks"]
        completion = [token for token, on in zip(example["input_ids"], mask, strict=True) if on]
        prompt_length = mask.index(1)
        turn = turns[key]
        if completion != sampled_completion(turn, tokenizer.eos_token_id) or \
                turn.get("prompt_tokens") not in (None, prompt_length):
            otherwise += 1
    return otherwise


GRPO_PROMPTS = ("What is 17 + 25? Answer with the number.", "Go north, take the coin, then say done.",
                "Call get_weather for Paris.", "List the files in /tmp with one shell command.")
GRPO_REPLY = "Let me think step by step. First I read the task, then I answer with one short line: "


def grpo_step(variant: str, model_dir: Path, prompts: int, samples: int, completion_tokens: int,
              steps: int) -> dict:
    """In this process: `steps` GRPO optimizer steps of the model (`variant` lora or full) on one fixed batch
    (a rollout_func that returns the same completions every step); the seconds of each step."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from datasets import Dataset
    from omrl.models.load import load_model
    from omrl.train.config.base import LoraSettings
    from omrl.train.config.grpo import GRPORecipe, trl_config

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_model(model_dir)  # as train_grpo loads it: float32 on a CPU
    with tempfile.TemporaryDirectory(prefix="omrl-grpo-step-") as out:
        recipe = GRPORecipe(model=str(model_dir), tasks="-", output_dir=out, max_steps=steps, tasks_per_step=prompts,
                            samples_per_task=samples, warmup_steps=0, learning_rate=1e-5, logging_steps=1,
                            max_completion_length=completion_tokens, use_cpu=True, quiet=True,
                            lora=LoraSettings(enabled=variant == "lora"))
        texts = {p: tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                  add_generation_prompt=True) for p in GRPO_PROMPTS[:prompts]}
        reply = tokenizer(GRPO_REPLY * 8, add_special_tokens=False)["input_ids"]

        def rollout(batch_prompts, trainer):
            ids = [tokenizer(texts[p], add_special_tokens=False)["input_ids"] for p in batch_prompts]
            completions = [reply[i % 7: i % 7 + completion_tokens] for i in range(len(batch_prompts))]
            return {"prompt_ids": ids, "completion_ids": completions,
                    "logprobs": [[-1.0] * len(c) for c in completions], "sample": list(range(len(batch_prompts)))}

        def reward(prompts, completions, sample, **kwargs):  # varies within a group: nonzero advantages
            return [float(s % 2) for s in sample]

        times: list[float] = []

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                self.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                times.append(time.perf_counter() - self.started)

        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=trl_config(recipe),
                              train_dataset=Dataset.from_dict({"prompt": list(texts) * 4}),
                              processing_class=tokenizer, rollout_func=rollout, callbacks=[StepClock()],
                              peft_config=recipe.lora.peft_config())
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        trainer.train()
    return {"step_s": times, "trainable_parameters": trainable, "dtype": str(model.dtype).replace("torch.", ""),
            "prompt_tokens": [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts.values()]}


def training(model_dir: Path, args: argparse.Namespace) -> dict:
    """Each variant's GRPO step in a child process (grpo_step), its peak RSS from the child's own rusage."""
    import subprocess

    out: dict = {"loadavg_1m": float(Path("/proc/loadavg").read_text().split()[0]),
                 "grpo_batch": f"{args.grpo_prompts} prompts x {args.grpo_samples} completions of "
                               f"{args.completion_tokens} tokens"}
    for variant in ("lora", "full"):
        child = subprocess.Popen([sys.executable, __file__, "--grpo-step", variant, "--grpo-prompts",
                                  str(args.grpo_prompts), "--grpo-samples", str(args.grpo_samples),
                                  "--completion-tokens", str(args.completion_tokens), "--grpo-steps",
                                  str(args.grpo_steps)], stdout=subprocess.PIPE, text=True)
        lines = child.stdout.read().strip().splitlines()
        _, status, usage = os.wait4(child.pid, 0)  # this child's rusage alone
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0 or not lines:
            raise RuntimeError(f"the {variant} GRPO step failed (exit {child.returncode})")
        result = json.loads(lines[-1])
        out[f"{variant}_grpo_step_s"] = round(result["step_s"][-1], 2)
        out[f"{variant}_grpo_steps_s"] = [round(t, 2) for t in result["step_s"]]
        out[f"{variant}_grpo_peak_gb"] = round(usage.ru_maxrss / 2**20, 2)  # ru_maxrss is in KiB on Linux
        out[f"{variant}_trainable_parameters"] = result["trainable_parameters"]
        out["grpo_dtype"], out["grpo_prompt_tokens"] = result["dtype"], result["prompt_tokens"]
    out["lora_vs_full_step"] = round(out["lora_grpo_step_s"] / out["full_grpo_step_s"], 3)
    return out


def eval_engine(n: int) -> dict:
    """The same evaluation played by each engine of iterate's eval.engine, timed."""
    from omrl.config import from_dict
    from omrl.store import Store
    from omrl.tasks import load_tasks
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.evaluation import evaluate_checkpoint

    tasks, out = load_tasks("shipped:grid_eval")[100:100 + n], {}
    with tempfile.TemporaryDirectory(prefix="omrl-eval-engine-") as work:
        for engine in ("vllm", "hf"):
            recipe = from_dict(IterateRecipe, {
                "output_dir": f"{work}/{engine}", "train_tasks": "shipped:grid_train", "eval_tasks": "shipped:grid_eval",
                "model": f"hf:{MODEL}", "rollout": {"env": "grid", "max_turns": 14, "max_new_tokens": 8},
                "eval": {"samples": 1, "greedy": True, "concurrency": 16, "engine": engine}})
            started = time.monotonic()
            evaluate_checkpoint(recipe, f"hf:{MODEL}", tasks, Store.create(f"{work}/{engine}-store"), "x", round=0)
            out[f"eval_{engine}_s"] = round(time.monotonic() - started, 1)
    out["eval_hf_vs_vllm"] = round(out["eval_hf_s"] / out["eval_vllm_s"], 2)
    return out


def lora_serving(model_dir: Path, n: int) -> dict:
    """The two ways a LoRA adapter reaches vLLM (merged into a copy, or loaded as an adapter), each timed from the
    adapter on disk to the last of the same n grid episodes played through it."""
    import torch
    from peft import LoraConfig, get_peft_model

    from omrl.models.adapters import merge_adapter
    from omrl.models.load import load_model
    from omrl.tasks import load_tasks

    tasks, out = load_tasks("shipped:grid_eval")[100:100 + n], {}
    with tempfile.TemporaryDirectory(prefix="omrl-lora-serving-") as work:
        torch.manual_seed(0)
        config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
        adapter = Path(work) / "adapter"
        get_peft_model(load_model(model_dir), config).save_pretrained(adapter)
        for way in ("merged", "adapter"):
            started = time.monotonic()
            if way == "merged":
                served = merge_adapter(adapter, Path(work) / "merged", base=str(model_dir))
                out["lora_merge_s"] = round(time.monotonic() - started, 1)
                server = VLLMServer(served, "merged", max_model_len=2048, max_num_seqs=16)
            else:
                server = VLLMServer(model_dir, "base", max_model_len=2048, max_num_seqs=16, extra_args=(
                    "--enable-lora", "--max-lora-rank", "16", "--lora-modules", f"adapter={adapter}"))
            with server:
                begun = time.monotonic()
                server.start(progress=lambda line: print(line, file=sys.stderr))
                out[f"lora_{way}_start_s"] = round(time.monotonic() - begun, 1)
                run = play("grid", tasks, make_policy(f"openai:{'merged' if way == 'merged' else 'adapter'}",
                                                      base_url=server.base_url), 14, 16, max_new_tokens=8)
            out[f"lora_{way}_play_s"] = run["wall_s"]
            out[f"lora_{way}_statuses"] = run["statuses"]
            out[f"lora_{way}_s"] = round(time.monotonic() - started, 1)
    out["lora_adapter_vs_merged"] = round(out["lora_adapter_s"] / out["lora_merged_s"], 2)
    return out


def learning(args: argparse.Namespace) -> dict:
    """The real-model study run (or resumed) in --study-out, its figures for the line."""
    from omrl.study.check import study_folder_of
    from omrl.study.figures import in_points
    from omrl.study.run import run_study
    from omrl.study.spec import load_study

    study = run_study(load_study(args.study), Path(args.study_out).expanduser(), study_folder_of(args.study),
                      log=lambda line: print(line, file=sys.stderr, flush=True))
    methods = study["conditions"][study["primary"]["condition"]]["methods"]
    out: dict = {"study": study["study"], "study_settings_hash": study["settings_hash"],
                 "test_scorings": study["test_scorings"], "distinct_test_tasks": study["distinct_test_tasks"],
                 "test_train_overlap": study["test_train_overlap"], "dev_test_overlap": study["dev_test_overlap"]}
    for name, entry in methods.items():
        for mode, figure in entry["test"].items():
            out[f"{name}_{mode}_per_seed"] = {seed: round(v, 4) for seed, v in figure["per_seed"].items()}
            out[f"{name}_{mode}_mean"] = round(figure["mean"], 4)
            out[f"{name}_{mode}_t_half_width"] = (None if figure["half_width"] is None
                                                  else round(figure["half_width"], 4))
    for name, reference in (("grpo", "base"), ("grpo", "sft"), ("grpo_base", "base")):
        diff = methods.get(name, {}).get(f"vs_{reference}")  # paired over seeds and tasks (omrl.study.figures)
        out[f"{name}_vs_{reference}_points"] = in_points(diff) if diff else None
    out["primary_contrast_points"] = study["primary_contrast_points"]  # grpo minus base, greedy (declared)
    out["primary_contrast_ci95"] = study["primary_contrast_ci95"]
    return out


def _default_turns(env: str) -> int:
    """The environment's own turn budget (a text game's step limit, ...), as collect uses it by default."""
    from omrl.envs import env_class

    return int(getattr(env_class(env), "default_max_turns", None) or 30)


def _drop_rows(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "rows"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="zero_shot,serving",
                        help="comma-separated: zero_shot, serving, training, eval_engine, lora_serving, learning")
    parser.add_argument("--envs", default="math,bfcl,twx,textworld,scienceworld,miniwob,swe,os")
    parser.add_argument("--n", type=int, default=4, help="tasks per environment (zero_shot); math tasks (serving)")
    parser.add_argument("--samples", type=int, default=4, help="samples per math task (serving)")
    parser.add_argument("--max-turns", type=int, default=12,
                        help="the model's turn budget, at most the environment's own (scripted and random get that)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--grpo-prompts", type=int, default=4, help="prompts of the GRPO step's batch (training)")
    parser.add_argument("--grpo-samples", type=int, default=4, help="completions per prompt (training)")
    parser.add_argument("--completion-tokens", type=int, default=32, help="tokens per completion (training)")
    parser.add_argument("--grpo-steps", type=int, default=2, help="steps per variant, the last reported (training)")
    parser.add_argument("--eval-tasks", type=int, default=16, help="grid tasks of the eval_engine and lora_serving parts")
    parser.add_argument("--study", default="shipped:studies/real_grid", help="the learning part's study file")
    parser.add_argument("--study-out", default="runs/real_grid", help="the learning study's folder (resumes)")
    parser.add_argument("--grpo-step", choices=("lora", "full"), help=argparse.SUPPRESS)  # a training child
    args = parser.parse_args()
    if args.grpo_step:
        print(json.dumps(grpo_step(args.grpo_step, fetch(MODEL), args.grpo_prompts, args.grpo_samples,
                                   args.completion_tokens, args.grpo_steps)))
        return
    parts = set(args.part.split(","))
    started, load_before = time.monotonic(), os.getloadavg()[0]
    model_dir = fetch(MODEL)
    out: dict = {"model": MODEL, "load_before": round(load_before, 1)}
    if "training" in parts:
        out.update(training(model_dir, args))
    if "eval_engine" in parts:
        out.update(eval_engine(args.eval_tasks))
    if "lora_serving" in parts:
        out.update(lora_serving(model_dir, args.eval_tasks))
    if "learning" in parts:
        out.update(learning(args))
    if parts & {"zero_shot", "serving"}:
        serve(out, parts, model_dir, args)
    out.update({"seconds": round(time.monotonic() - started, 1), "load_after": round(os.getloadavg()[0], 1)})
    print(json.dumps(out))


def serve(out: dict, parts: set[str], model_dir: Path, args: argparse.Namespace) -> None:
    """The parts that need the model served by vLLM (zero_shot, serving), into `out`."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="omrl-real-model-") as work, \
            VLLMServer(model_dir, "smollm2", max_model_len=args.max_model_len, max_num_seqs=16) as server:
        server.start(progress=lambda line: print(line, file=sys.stderr))
        out["vllm_start_s"] = round(time.monotonic() - started, 1)
        if "zero_shot" in parts:
            table = zero_shot(server, args.envs.split(","), args.n, args.max_turns, Path(work))
            out["zero_shot"] = {env: row.get("model", {}).get("success") for env, row in table.items()}
            out["zero_shot_table"] = table
            tool_runs = [row["model"] for env, row in table.items() if env in TOOL_ENVS and "model" in row]
            episodes = sum(run["episodes"] for run in tool_runs)
            errors = sum(run["statuses"].get("policy_error", 0) for run in tool_runs)
            out["tool_episodes_policy_error_share"] = round(errors / episodes, 3) if episodes else None
        if "serving" in parts:
            out.update(serving(server, model_dir, args.n, args.samples))


if __name__ == "__main__":
    main()
