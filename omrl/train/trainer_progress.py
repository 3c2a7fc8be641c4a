"""Training shown through omrl.progress: a TrainerCallback reporting a transformers/TRL Trainer's steps to a
Reporter, and the libraries' own output turned off while a command shows its reporter instead.

    with quiet_libraries(), terminal_reporter() as reporter:     # what `omrl train` and `omrl demo` do
        result = train_sft(recipe, reporter=reporter)             # the Trainer gets reporter_callback(...)

Inside `quiet_libraries()` transformers' log printer and tqdm bar (the callbacks every Trainer adds) are a
silent callback, weight-loading bars, deprecation warnings and library info logs are off; `--verbose`
commands skip it and leave the libraries' output as they print it, beside the reporter's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

from omrl.progress import Reporter

_QUIET_LOGGERS = ("transformers", "trl", "datasets", "accelerate", "peft", "torch")
SHOWN = ("loss", "reward")  # the logged values a Trainer's reporter shows beside the step count


def reporter_callback(reporter: Reporter, label: str) -> Any:
    """A TrainerCallback that starts `label` on `reporter` with the run's steps, advances it once per optimizer
    step and shows the loss and reward logged at that step with it, once (the trainer calls reporter.finish
    when training ends)."""
    from transformers import TrainerCallback

    class ReporterCallback(TrainerCallback):
        # A Trainer logs a step after its on_step_end: the step is counted when the next begins (or training
        # ends), so its loss and reward, and the success its rollouts gave during it, are shown on its line.
        ended = 0

        def on_train_begin(self, args, state, control, **kwargs):
            reporter.start(label, total=state.max_steps or None)

        def on_step_begin(self, args, state, control, **kwargs):
            self._count()

        def on_step_end(self, args, state, control, **kwargs):
            self.ended += 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            fields = {key: logs[key] for key in SHOWN if key in (logs or {})}
            if fields:
                reporter.advance(0, **fields)

        def on_train_end(self, args, state, control, **kwargs):
            self._count()

        def _count(self) -> None:
            if self.ended:
                reporter.advance(self.ended)
                self.ended = 0

    return ReporterCallback()


@contextlib.contextmanager
def quiet_libraries(enabled: bool = True) -> Iterator[None]:
    """transformers' printer and tqdm bar silent, loading bars, warnings and info logs off (not `enabled`: as is)."""
    if not enabled:
        yield
        return
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
            from transformers import TrainerCallback
            from transformers.utils import logging as hf_logging
        except ImportError:  # pragma: no cover - training needs transformers anyway
            trainer_module = hf_logging = None
        if trainer_module is not None:
            saved = (trainer_module.PrinterCallback, trainer_module.DEFAULT_PROGRESS_CALLBACK,
                     hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())

            class Silent(TrainerCallback):
                """In place of the printer and the tqdm bar: the reporter shows the steps."""

            # Trainer.__init__ adds PrinterCallback (disable_tqdm) or DEFAULT_PROGRESS_CALLBACK (tqdm) from
            # these module globals: both are the silent callback while the block runs.
            trainer_module.PrinterCallback = trainer_module.DEFAULT_PROGRESS_CALLBACK = Silent
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
