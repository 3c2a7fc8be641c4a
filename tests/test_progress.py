"""omrl.progress: the one reporter interface and its terminal, log and quiet forms."""

from __future__ import annotations

import io

from rich.console import Console

from omrl.progress import QUIET, LineReporter, Reporter, RichReporter, render_fields, terminal_reporter


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200, color_system=None), out


def test_fields_render_as_name_value_pairs():
    assert render_fields({"success": 0.625, "loss": 1.23456, "errors": 2, "note": "x", "gone": None}) == \
        "success 62%  loss 1.235  errors 2  note x"


def test_every_form_is_a_reporter():
    for reporter in (QUIET, LineReporter(_console(False)[0]), RichReporter(_console(True)[0])):
        assert isinstance(reporter, Reporter)


def test_lines_for_long_work_and_nothing_for_short():
    console, out = _console(False)
    short = LineReporter(console, every_s=3600)
    short.start("collect r", total=3)
    short.advance(3, errors=0)
    short.finish()
    assert out.getvalue() == ""
    long = LineReporter(console, every_s=0)
    long.start("collect r", total=3)
    long.advance(1, success="50%")
    long.advance(2, success="67%")
    long.finish("done: 3 played")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("collect r 1/3  success 50%")
    assert lines[1].startswith("collect r 3/3  success 67%")
    assert lines[-2].startswith("collect r 3/3  success 67%") and lines[-1] == "done: 3 played"


def test_rich_bar_shows_the_work_and_stops_on_exit():
    console, out = _console(True)
    with RichReporter(console, transient=False) as reporter:
        reporter.start("judge correctness", total=4)
        reporter.advance(2, errors=1)
        reporter.bar.refresh()
        reporter.log("a kept line")
    assert not reporter.bar.live.is_started
    text = out.getvalue()
    assert "judge correctness" in text and "2/4" in text and "errors 1" in text and "a kept line" in text


def test_terminal_reporter_picks_by_the_console():
    assert terminal_reporter(False) is QUIET
    assert isinstance(terminal_reporter(True, _console(False)[0]), LineReporter)
    assert isinstance(terminal_reporter(True, _console(True)[0]), RichReporter)


def test_a_field_is_shown_with_its_unit_once_and_a_count_is_printed_once():
    console, out = _console(False)
    reporter = LineReporter(console, every_s=0)
    reporter.start("grpo", total=3)
    reporter.advance(0, success=0.5)  # given while unit 1 is in progress: shown with it, not before
    assert out.getvalue() == ""
    reporter.advance(1, loss=0.25)
    reporter.advance(1)
    reporter.advance(1, success=0.75)
    reporter.finish()
    lines = [line.rsplit("  [", 1)[0] for line in out.getvalue().splitlines()]
    assert lines == ["grpo 1/3  success 50%  loss 0.250", "grpo 2/3", "grpo 3/3  success 75%"]


def test_the_training_callback_shows_each_step_once_with_the_values_logged_at_it():
    from types import SimpleNamespace

    from omrl.train.trainer_progress import reporter_callback

    console, out = _console(False)
    reporter = LineReporter(console, every_s=0)
    callback = reporter_callback(reporter, "grpo")
    args, control = SimpleNamespace(), SimpleNamespace()
    state = SimpleNamespace(max_steps=4, global_step=0)
    callback.on_train_begin(args, state, control)
    # What a GRPO Trainer does: per step, rollouts (their success), on_step_end, then a log every 2nd step.
    for step, success in enumerate((0.5, 0.25, 0.75, 1.0), start=1):
        callback.on_step_begin(args, state, control)
        reporter.advance(0, success=success)
        state.global_step = step
        callback.on_step_end(args, state, control)
        if step % 2 == 0:
            callback.on_log(args, state, control, logs={"loss": step / 10, "reward": step / 4, "epoch": 1.0})
    callback.on_log(args, state, control, logs={"train_loss": 0.3, "train_runtime": 1.0})
    callback.on_train_end(args, state, control)
    reporter.finish()
    lines = [line.rsplit("  [", 1)[0] for line in out.getvalue().splitlines()]
    assert lines == ["grpo 1/4  success 50%",
                     "grpo 2/4  success 25%  loss 0.200  reward 0.500",
                     "grpo 3/4  success 75%",
                     "grpo 4/4  success 100%  loss 0.400  reward 1.000"]
