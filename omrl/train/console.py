"""The training console: one rich view of a run (stage, step, loss or reward and success so far, time left).

    with training_view(verbose=False) as view:
        with view.stage("sft", "SFT on expert demos"):
            train_sft(recipe)              # every transformers/TRL Trainer made inside reports to the view
        view.done("sft", "success 62.0%")

While the view is active (and not `verbose`), every `transformers.Trainer` made (TRL's SFT and GRPO
trainers included) gets a `ViewCallback` in place of transformers' log printer and tqdm bar: the view
shows one progress line per stage instead of dict logs; weight-loading bars, deprecation warnings and
library info logs are silenced. `verbose=True` leaves all of that as the libraries print it, and the
view only prints the stage lines. A view on output that is not a terminal prints plain lines (no
live redraw), so logs of `make demo | tee` stay readable.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

try:  # transformers is a training dependency; the view itself (stage lines) works without it
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - training commands need transformers anyway
    TrainerCallback = object  # type: ignore[assignment,misc]


class TrainingView:
    """A rich Live progress of the run's stages on stderr; `stage()` opens one, trainers advance it."""

    def __init__(self, verbose: bool = False, console: Any = None, title: str = "omrl"):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.verbose = verbose
        self.title = title
        self.console = console or Console(stderr=True, soft_wrap=True)  # piped output is not wrapped
        self.progress = Progress(SpinnerColumn(), TextColumn("[bold cyan]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
                                 TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("left"),
                                 TimeRemainingColumn(), console=self.console, transient=True)
        self.task: Any = None
        self.stats: dict[str, Any] = {}
        self.success: Callable[[], float | None] | None = None
        self.started = self.last_line = time.monotonic()
        self.line_every_s = 30.0
        self.name = ""
        self.total: int | None = None

    def __enter__(self) -> TrainingView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    @contextlib.contextmanager
    def stage(self, name: str, description: str = "", total: int | None = None,
              success: Callable[[], float | None] | None = None) -> Iterator[TrainingView]:
        """Show stage `name` until the block ends; `success` (optional) tells the success rate so far."""
        self.console.print(f"[bold cyan]{self.title}[/] [bold]{name}[/] {description}".rstrip())
        self.stats, self.success, self.name, self.total = {}, success, name, total
        self.last_line = time.monotonic()
        self.task = self.progress.add_task(name, total=total, stats="")
        try:
            yield self
        finally:
            self.progress.remove_task(self.task)
            self.task, self.success = None, None

    def start(self, total: int | None) -> None:
        self.total = total
        if self.task is not None:
            self.progress.reset(self.task, total=total, stats="")

    def advance(self, completed: int, logs: dict[str, Any] | None = None) -> None:
        if self.task is None:
            return
        if logs:
            for key, label in (("loss", "loss"), ("reward", "reward")):
                if key in logs:
                    self.stats[label] = logs[key]
            if self.success is not None:
                with contextlib.suppress(Exception):  # a view must never break training
                    self.stats["success"] = self.success()
        self.progress.update(self.task, completed=completed, stats=self._stats())
        if not self.console.is_terminal and time.monotonic() - self.last_line >= self.line_every_s:
            # No live redraw off a terminal: a plain progress line now and then, so a log shows the run going.
            self.last_line = time.monotonic()
            self.console.print(f"  {self.name} step {completed}" + (f"/{self.total}" if self.total else "")
                               + f"  {self._stats()}".rstrip())

    def _stats(self) -> str:
        parts = []
        for key, value in self.stats.items():
            if value is None:
                continue
            parts.append(f"{key} {value:.0%}" if key == "success" else f"{key} {value:.3f}")
        return "  ".join(parts)

    def done(self, name: str, summary: str) -> None:
        minutes = (time.monotonic() - self.started) / 60
        self.console.print(f"[bold cyan]{self.title}[/] [bold green]{name}[/] {summary}  [dim][{minutes:.1f} min][/]")

    def print(self, *args: Any, **kwargs: Any) -> None:
        self.console.print(*args, **kwargs)


class ViewCallback(TrainerCallback):
    """A TRL/transformers TrainerCallback that feeds a TrainingView (steps, loss, reward) instead of printing."""

    def __init__(self, view: TrainingView):
        self.view = view

    def on_train_begin(self, args, state, control, **kwargs):
        self.view.start(state.max_steps or None)

    def on_step_end(self, args, state, control, **kwargs):
        self.view.advance(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.view.advance(state.global_step, logs or {})


_QUIET_LOGGERS = ("transformers", "trl", "datasets", "accelerate", "peft", "torch")


@contextlib.contextmanager
def training_view(verbose: bool = False, title: str = "omrl", console: Any = None) -> Iterator[TrainingView]:
    """A TrainingView that every Trainer made inside reports to; quiet libraries unless `verbose`."""
    view = TrainingView(verbose=verbose, console=console, title=title)
    with contextlib.ExitStack() as stack:
        if not verbose:
            stack.enter_context(_quiet_libraries(ViewCallback(view)))
        else:
            stack.enter_context(_extra_callback(ViewCallback(view)))
        with view:
            yield view


@contextlib.contextmanager
def _extra_callback(callback: Any) -> Iterator[None]:
    """Every Trainer made inside also gets `callback` (the libraries' own output untouched)."""
    try:
        import transformers.trainer as trainer_module
    except ImportError:  # pragma: no cover
        yield
        return
    trainer_module.DEFAULT_CALLBACKS.append(callback)
    try:
        yield
    finally:
        trainer_module.DEFAULT_CALLBACKS.remove(callback)


@contextlib.contextmanager
def _quiet_libraries(callback: Any) -> Iterator[None]:
    """transformers' log printer and tqdm bar replaced by `callback`; loading bars, warnings and info logs off."""
    import os

    saved_env = {k: os.environ.get(k) for k in ("TRL_EXPERIMENTAL_SILENCE", "TRANSFORMERS_VERBOSITY")}
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            import transformers.trainer as trainer_module
            from transformers.utils import logging as hf_logging
        except ImportError:  # pragma: no cover
            trainer_module = hf_logging = None
        if trainer_module is not None:
            saved = (trainer_module.PrinterCallback, trainer_module.DEFAULT_PROGRESS_CALLBACK,
                     hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
            # Trainer.__init__ adds PrinterCallback (disable_tqdm) or DEFAULT_PROGRESS_CALLBACK (tqdm) from
            # these module globals: both become the view's callback while the view is active.
            trainer_module.PrinterCallback = trainer_module.DEFAULT_PROGRESS_CALLBACK = callback
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        datasets_bars = _datasets_bars(False)  # the "Building labels / Truncating" map bars of TRL's SFT
        try:
            yield
        finally:
            if datasets_bars:
                _datasets_bars(True)
            if trainer_module is not None:
                trainer_module.PrinterCallback, trainer_module.DEFAULT_PROGRESS_CALLBACK = saved[:2]
                hf_logging.set_verbosity(saved[2])
                if saved[3]:
                    hf_logging.enable_progress_bar()
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _datasets_bars(enable: bool) -> bool:
    """Turn the datasets library's progress bars on or off; returns whether they were on."""
    try:
        from datasets.utils import logging as ds_logging
    except ImportError:  # pragma: no cover
        return False
    was = ds_logging.is_progress_bar_enabled()
    (ds_logging.enable_progress_bar if enable else ds_logging.disable_progress_bar)()
    return was
