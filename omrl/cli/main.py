"""The `omrl` entry point. Verbs are imported only when run, so `omrl --help` stays fast."""

from __future__ import annotations

import difflib

import click

from omrl import __version__
from omrl.plugins import Registry

# verb -> (module:attribute, one-line help). Add a verb here and in its own module under omrl/cli/.
COMMANDS = Registry("command", None, {
    "schema": ("omrl.cli.schema:schema", "Print the trajectory and annotation schemas."),
    "store": ("omrl.cli.store:store", "Create, append to, check and compact trajectory stores."),
    "query": ("omrl.cli.query:query", "Run read-only SQL over a store."),
    "stats": ("omrl.cli.stats:stats", "Summarise a store: counts, rewards, success."),
    "show": ("omrl.cli.show:show", "Render one trajectory readably."),
    "annotate": ("omrl.cli.annotate:annotate", "Score trajectories: metrics, LLM judge, combined reward."),
    "filter": ("omrl.cli.filter:filter_", "Select, deduplicate, best-of-n and split trajectories into a new store."),
    "augment": ("omrl.cli.augment:augment", "Derive perturbed trajectories (paraphrase, tool rename, ...)."),
    "collect": ("omrl.cli.collect:collect", "Play tasks x samples episodes with a policy into a store (resumable)."),
    "eval": ("omrl.cli.eval:eval_", "Evaluate a policy: success rate, mean reward, pass@k."),
    "models": ("omrl.cli.models:models", "Build tiny offline models; fetch real pretrained ones by name."),
    "serve": ("omrl.cli.serve:serve", "Serve a model with a real vLLM on 127.0.0.1 for openai: policies."),
    "train": ("omrl.cli.train:train", "Train on stored experience: sft, grpo, ppo, rft, iterate."),
    "report": ("omrl.cli.report:report", "Plots and a Markdown/HTML summary of a store and a run, or of a study."),
    "tasks": ("omrl.cli.tasks:tasks", "Import, show and generate task datasets."),
    "recipes": ("omrl.cli.recipes:recipes", "List the recipes shipped with omrl; copy one to edit."),
    "demo": ("omrl.cli.demo:demo", "Run the learning demo: tiny model, grid env, SFT then GRPO, on the CPU."),
    "envs": ("omrl.cli.envs:envs", "List environments; serve one over the AgentGym HTTP protocol."),
    "plugins": ("omrl.cli.plugins:plugins", "List the environments, formats, metrics and policies plugins add."),
    "import": ("omrl.cli.import_:import_cmd", "Import trajectory files (ShareGPT, OpenAI, SWE-agent, ...) into a store."),
    "export": ("omrl.cli.export:export", "Export a store to a dataset folder or JSONL (omrl/OpenAI/ShareGPT); push to the Hub."),
    "view": ("omrl.cli.view:view", "Browse trajectories in a local read-only web viewer, or export static HTML."),
    "study": ("omrl.cli.study:study", "Check a study (methods x seeds x conditions, held-out sets new by fingerprint)."),
})


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return COMMANDS.names()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return COMMANDS.load(name) if COMMANDS.get(name) is not None else None

    def resolve_command(self, ctx: click.Context, args: list[str]):
        # click suggests close names only from commands it holds; these are loaded lazily, so suggest here
        name = args[0] if args else ""
        if name and not name.startswith("-") and COMMANDS.get(name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3)
            ctx.fail(f"No such command {name!r}." + (f" Did you mean {' or '.join(map(repr, close))}?" if close else ""))
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table above, so listing verbs imports none of them.
        rows = [(name, COMMANDS.get(name).summary) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="omrl")
@click.option("--debug", is_flag=True, help="Show the traceback of every error, not only of bugs (or OMRL_DEBUG=1).")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """omrl: collect, annotate, filter and train on agent trajectories.

    \b
    The chain:  omrl tasks import -> omrl collect -> omrl annotate
                -> omrl filter / augment -> omrl train -> omrl eval / report
    Every step reads and writes a trajectory store (Parquet + DuckDB).

    Example:  omrl stats demo-store
    """
    ctx.meta["omrl.debug"] = debug
