"""`omrl collect`: play tasks x samples episodes with a policy and append them to a store (resumable)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import click

from omrl.cli.common import console, err_console, user_errors


def option_texts(values: tuple[str, ...], flag: str = "--env-option") -> dict[str, str]:
    """KEY=VALUE pairs as key -> its text."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=flag)
        out[key] = value
    return out


def env_options(values: tuple[str, ...], flag: str = "--env-option") -> dict[str, Any]:
    """KEY=VALUE pairs; values are read as JSON when they parse (numbers, true/false), else as text."""
    from omrl.envs.options import read_value

    return {key: read_value(text) for key, text in option_texts(values, flag).items()}


def _settings_options() -> list[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """One click option per RolloutSettings field: flag, default and help come from the dataclass."""
    import dataclasses
    import typing

    from omrl.rollout import RolloutSettings

    hints = typing.get_type_hints(RolloutSettings)
    options = []
    for f in dataclasses.fields(RolloutSettings):
        flag, text = f.metadata["flag"], f.metadata["help"]
        help_text = text[0].upper() + text[1:] + "."
        if f.name == "env":
            options.append(click.option(flag, "env_spec", required=True, help=help_text))
        elif f.name == "env_options":
            options.append(click.option(flag, "env_option", multiple=True, metavar="KEY=VALUE",
                                        help=help_text[:-1] + " (repeatable)."))
        elif f.name == "ray_resources":
            options.append(click.option(flag, "ray_resource", multiple=True, metavar="NAME=AMOUNT",
                                        help=help_text[:-1] + " (repeatable)."))
        else:
            kind = next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name])
            names = [flag, *f.metadata.get("aliases", ()), *(["-c"] if f.name == "concurrency" else [])]
            default = f.metadata.get("cli_default", f.default)
            options.append(click.option(*names, f.name, default=default, type=kind,
                                        show_default=default is not None, help=help_text))
    return options


def rollout_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The flags collect and eval share: the RolloutSettings fields, then the run's own."""
    options = [
        *_settings_options(),
        # A plain string, not click.Path(exists=True): `shipped:NAME` names a task set shipped with omrl,
        # and load_tasks reports a missing file as one clear line.
        click.option("--tasks", "tasks_path", required=True,
                     help="Tasks file (from `omrl tasks import`), or shipped:NAME for a shipped task set."),
        click.option("--policy", "policy_spec", default=None,
                     help="openai:MODEL, hf:PATH, scripted, random, or a plugin policy NAME[:ARG] (omrl plugins). "
                          "Required (except for `omrl eval --predictions`)."),
        click.option("--round", "round_", default=0, show_default=True, help="Iteration round (iterative training)."),
        click.option("--run", "run_id", default=None,
                     help="Run name; default derived from env, tasks file and policy, so re-runs resume."),
        click.option("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)."),
        click.option("--context-length", default=None, type=click.IntRange(min=1),
                     help="openai:MODEL: the model's context in tokens, for the prompt budget (default: what the "
                          "server says, llama.cpp's /props or vLLM's /v1/models); a turn that would not fit ends "
                          "the episode as truncated."),
        click.option("--server-tokens", default=None, type=click.Choice(["auto", "standard", "off"]),
                     help="openai:MODEL: ask the server for each completion's token ids and logprobs, stored in "
                          "turns: auto (default: logprobs, plus vLLM/SGLang token-id fields except on "
                          "api.openai.com), standard (logprobs only) or off."),
        click.option("--tool-format", default=None, type=click.Choice(["auto", "native", "text"]),
                     help="openai:MODEL: how tools reach the model: native (the request's `tools`), text (described "
                          "in the system prompt, <tool_call> blocks read from the reply: for a server or chat "
                          "template without tool support) or auto (default: native until the server refuses "
                          "tools, e.g. vLLM without a tool parser, then text, said in one line)."),
        click.option("--limit", default=None, type=int, help="Use only the first N tasks."),
        click.option("--split", default=None, help="Use only tasks of this split."),
        click.option("--unsafe-no-sandbox", is_flag=True, default=False,
                     help="UNSAFE: run agent-written code (the code env's tests) without the bubblewrap sandbox, "
                          "with your privileges, files and network. Same as --env-option unsafe_no_sandbox=true."),
        click.option("--batch-size", default=64, show_default=True, help="Episodes per store append."),
        click.option("--retry-failed", is_flag=True, default=False,
                     help="Also play again each episode whose stored rows all failed (env_error, policy_error, "
                          "timeout), as its next attempt: the attempt number joins its id's inputs (run, round, "
                          "task, sample), so the failed rows stay in the store as history beside the new one; "
                          "eval counts each episode's last attempt."),
        click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS|local",
                     help="Play the episodes on a Ray cluster: auto (the running one), HOST:PORT, or local "
                          "(start one on this machine). Needs `pip install omrl[ray]`."),
        click.option("--progress/--no-progress", default=True, help="Show the progress bar."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def prepare(tasks_path: str, policy_spec: str, base_url: str | None, concurrency: int,
            limit: int | None, split: str | None, server_tokens: str | None = None,
            context_length: int | None = None, tool_format: str | None = None):
    """Tasks and policy from the CLI flags."""
    from omrl.policies import make_policy
    from omrl.tasks import load_tasks

    if not policy_spec:
        raise click.UsageError("Missing option '--policy'.")
    tasks = load_tasks(tasks_path, split=split)
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise click.ClickException(f"no tasks in {tasks_path}" + (f" for split {split!r}" if split else ""))
    options: dict[str, Any] = {}
    if policy_spec.startswith("openai:"):
        options = {"base_url": base_url, "max_connections": max(concurrency, 16), "tokens": server_tokens,
                   "context_length": context_length, "tool_format": tool_format}
    elif base_url:
        raise click.BadParameter("--base-url only applies to openai:MODEL policies", param_hint="--base-url")
    elif context_length:
        raise click.BadParameter("--context-length only applies to openai:MODEL policies",
                                 param_hint="--context-length")
    elif server_tokens:
        raise click.BadParameter("--server-tokens only applies to openai:MODEL policies", param_hint="--server-tokens")
    elif tool_format:
        raise click.BadParameter("--tool-format only applies to openai:MODEL policies", param_hint="--tool-format")
    return tasks, make_policy(policy_spec, **options)


async def closing(policy: Any, work: Awaitable[Any]) -> Any:
    """Await `work`, then close the policy's HTTP clients (when it has any) on the loop that opened them."""
    try:
        return await work
    finally:
        close = getattr(policy, "aclose", None)
        if close is not None:
            await close()


def rollout_settings(args: dict[str, Any]):
    """The RolloutSettings the flags describe, with an hf:CHECKPOINT policy's saved settings for the flags not
    given (checkpoint_rollout)."""
    import dataclasses

    from omrl.envs import env_options as typed_env_options
    from omrl.rollout import RolloutSettings

    values = {f.name: args[f.name] for f in dataclasses.fields(RolloutSettings) if f.name in args}
    saved = checkpoint_rollout(args)
    options = {**saved.pop("env_options", {}), **typed_env_options(args["env_spec"], option_texts(args["env_option"]))}
    return RolloutSettings(**{**values, **saved}, env=args["env_spec"],
                           ray_resources=ray_resources(args.get("ray_resource", ())),
                           env_options={**options,
                                        **({"unsafe_no_sandbox": True} if args.get("unsafe_no_sandbox") else {})})


def checkpoint_rollout(args: dict[str, Any]) -> dict[str, Any]:
    """The rollout settings an hf:CHECKPOINT policy was trained with (its omrl_rollout.json) for each flag the
    command line did not give (click's ParameterSource; env options key by key), said in one line; {} for other
    policies, a checkpoint without the file, or one trained on another environment than --env (also said)."""
    from pathlib import Path

    from omrl.rollout.checkpoint_settings import CARRIED, read_rollout_settings

    spec = args.get("policy_spec") or ""
    folder = Path(spec[3:]) if spec.startswith("hf:") else None
    saved = read_rollout_settings(folder) if folder is not None and folder.is_dir() else None
    if not saved:
        return {}
    if saved.get("env") not in (None, args["env_spec"]):
        err_console.print(f"the checkpoint was trained on env {saved['env']}: its rollout settings are not used "
                          f"for --env {args['env_spec']}", highlight=False)
        return {}
    ctx = click.get_current_context(silent=True)
    given = {click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT,
             click.core.ParameterSource.PROMPT}
    flags = set(option_texts(args["env_option"]))
    saved["env_options"] = {k: v for k, v in (saved.get("env_options") or {}).items() if k not in flags}
    used = {name: saved[name] for name in CARRIED if saved.get(name) not in (None, {}) and
            (name == "env_options" or ctx is None or ctx.get_parameter_source(name) not in given)}
    if used:
        err_console.print("using the checkpoint's rollout settings: "
                          + ", ".join(f"{name}={value}" for name, value in used.items())
                          + " (a flag overrides each)", highlight=False)
    return used


def ray_resources(values: tuple[str, ...]) -> dict[str, float]:
    """NAME=AMOUNT pairs of custom Ray resources, amounts as non-negative numbers."""
    out: dict[str, float] = {}
    for item in values:
        name, sep, amount = item.partition("=")
        try:
            number = float(amount)
        except ValueError:
            number = -1.0
        if not sep or not name or not number >= 0 or number == float("inf"):
            raise click.BadParameter(f"{item!r} is not NAME=AMOUNT with a non-negative AMOUNT",
                                     param_hint="--ray-resource")
        out[name] = number
    return out


def rollout_kwargs(args: dict[str, Any]) -> dict[str, Any]:
    """collect's arguments from the flags: the settings object, the executor (--ray) and the run's own options."""
    from omrl.rollout.executor import executor_for

    # First: without Ray installed, --ray says so before tasks or models load.
    executor = executor_for(args.get("ray_address"))
    return {"settings": rollout_settings(args), "round": args["round_"], "batch_size": args["batch_size"],
            "executor": executor, "retry_failed": args.get("retry_failed", False)}


def run_interruptible(work: Callable[[Callable[[Any], None]], Awaitable[Any]], run_id: str, kept_in: str) -> Any:
    """asyncio.run(work(on_finish)); on Ctrl-C, one line saying what the interrupted run kept (collect writes its
    finished episodes before it stops), then exit 130, the shell's code for an interrupt."""
    finished: list[Any] = []
    try:
        return asyncio.run(work(finished.append))
    except KeyboardInterrupt:
        if finished:
            done = finished[-1]
            console.print(f"interrupted: run {run_id} round {done.round}: {done.played} played, {done.written} "
                          f"written to {kept_in}; run the same command again to play the rest", highlight=False)
        else:
            console.print(f"interrupted: run {run_id}: no episode finished, nothing written", highlight=False)
        raise SystemExit(130) from None


class RequiredFirstCommand(click.Command):
    """A command whose --help lists the options a run needs first (click's required ones and `needed`, which
    the command checks itself), then the others as declared; parsing stays click's own."""

    def __init__(self, *args: Any, needed: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.needed = needed

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        params = self.get_params(ctx)
        first = [p for p in params if p.required or p.name in self.needed]
        rows = [row for p in first + [p for p in params if p not in first] if (row := p.get_help_record(ctx))]
        if rows:
            with formatter.section("Options"):
                formatter.write_dl(rows)


@click.command(cls=RequiredFirstCommand, needed=("policy_spec",))  # --policy: optional for eval, not here
@rollout_options
@click.option("--store", "store_path", required=True, type=click.Path(), help="Store to append to (created if missing).")
@click.option("--samples", "-n", default=1, show_default=True, help="Samples per task (the GRPO group size).")
@user_errors
def collect(store_path: str, samples: int, **args: Any) -> None:
    """Play tasks x samples episodes with a policy and append them to a store; re-running resumes.

    \b
    Example:  omrl collect --env math --tasks shipped:math_arith --policy openai:qwen --store runs -n 4 -c 32
    """
    from omrl.progress import terminal_reporter
    from omrl.rollout import collect as run_collect
    from omrl.rollout import default_run_name
    from omrl.store import Store

    options = rollout_kwargs(args)  # first: a bad flag (or --ray without Ray) fails before models load
    tasks, policy = prepare(args["tasks_path"], args["policy_spec"], args["base_url"], args["concurrency"],
                            args["limit"], args["split"], args["server_tokens"], args["context_length"],
                            args["tool_format"])
    run_id = args["run_id"] or default_run_name(args["env_spec"], args["tasks_path"], args["policy_spec"])
    store = Store.create(store_path)
    with terminal_reporter(args["progress"], err_console) as reporter:
        result = run_interruptible(
            lambda on_finish: closing(policy, run_collect(None, tasks, policy, store, samples=samples, run_id=run_id,
                                                          reporter=reporter, on_finish=on_finish, **options)),
            run_id, store_path)
    statuses = ", ".join(f"{s} {n}" for s, n in sorted(result.statuses.items())) or "nothing to do"
    rate = f"{result.success_rate:.1%}" if result.success_rate is not None else "-"
    retried = f" ({result.retried} failed before, retried)" if result.retried else ""
    console.print(f"run [bold]{run_id}[/bold] round {result.round}: {result.played} played{retried}, "
                  f"{result.skipped} already stored, {result.written} written to {store_path}; "
                  f"success {rate}; {statuses}", highlight=False)
    if result.already_stored:
        console.print(f"{result.already_stored} episode(s) played here were stored first by another run of the "
                      "same command; those rows were not written twice", highlight=False)
    if result.errors:
        console.print(f"[yellow]{result.errors} episode(s) failed; see: omrl query {store_path} "
                      f"\"SELECT status, error FROM trajectories WHERE status NOT IN ('ok', 'truncated')\"; "
                      "play them again with --retry-failed[/yellow]")
