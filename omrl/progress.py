"""The one progress interface: engines report their work to a Reporter the caller hands in; how it is shown
(a rich bar on a terminal, plain lines in a log, nothing in tests) is the caller's choice.

    with terminal_reporter() as reporter:          # the CLI: rich on a terminal, plain lines when piped
        result = await collect(None, tasks, policy, store, reporter=reporter)

    reporter.start("collect run-1", total=40)      # an engine: one piece of work at a time
    reporter.advance(1, success="50%", errors=0)   # n units done; fields shown beside the count
    reporter.advance(0, loss=0.12)                 # a field for the unit in progress, shown with it
    reporter.log("judge: 3 invalid replies")      # a line that stays
    reporter.finish()                              # the piece is done (also on failure: call it in finally)

- Fields are shown as "name value" in the order given. A string is shown as it is, a float as 0.123 (a field
  named `success` as 62%), None not at all.
- Fields belong to the units they are given for, and are shown once: `advance(0, ...)` holds its fields for
  the unit in progress, the next `advance(n)` (n > 0) shows them with its own; a later unit never repeats
  them (a loss logged at step 5 is not shown at steps 6, 7, ...). A count is printed at most once.
- A reporter is used by one piece of work at a time: `start` again after `finish` for the next stage.
- Engines default to QUIET; a reporter must never break the work it shows.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Reporter(Protocol):
    """What an engine may tell about its progress."""

    def start(self, label: str, total: int | None = None) -> None:
        """A piece of work begins: `total` units (None: not known)."""

    def advance(self, n: int = 1, **fields: Any) -> None:
        """`n` more units are done, with `fields` (0: fields for the unit in progress, shown when it is done)."""

    def log(self, message: str) -> None:
        """A line that stays in the output, above any bar."""

    def finish(self, summary: str | None = None) -> None:
        """The piece of work started last is done; `summary`, when given, is logged."""


def render_fields(fields: dict[str, Any]) -> str:
    """'name value' pairs, two spaces apart: strings as they are, floats to 3 places (success as a percentage)."""
    parts = []
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.0%}" if name == "success" else f"{value:.3f}"
        parts.append(f"{name} {value}")
    return "  ".join(parts)


class QuietReporter:
    """Shows nothing: the default of every engine, and what tests pass."""

    def start(self, label: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1, **fields: Any) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def finish(self, summary: str | None = None) -> None:
        pass

    def __enter__(self) -> QuietReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


QUIET = QuietReporter()


class _Counting:
    """The state every showing reporter keeps: label, units done of total, fields, when the piece started."""

    def __init__(self) -> None:
        self.label, self.total, self.done = "", None, 0
        self.fields: dict[str, Any] = {}  # given for the unit in progress (advance(0, ...)), not shown yet
        self.shown: dict[str, Any] = {}  # the fields of the last units done: what a line shows
        self.started = time.monotonic()
        self.active = False

    def _start(self, label: str, total: int | None) -> None:
        self.label, self.total, self.done, self.fields, self.shown = label, total, 0, {}, {}
        self.started, self.active = time.monotonic(), True

    def _advance(self, n: int, fields: dict[str, Any]) -> None:
        self.fields.update(fields)
        if n > 0:  # the held fields are the new units': what was shown before is not repeated
            self.done += n
            self.shown, self.fields = self.fields, {}

    def line(self) -> str:
        """'label done/total  fields  [elapsed]': the plain form of the bar."""
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        stats = render_fields(self.shown)
        elapsed = time.monotonic() - self.started
        return f"{self.label} {count}" + (f"  {stats}" if stats else "") + f"  [{elapsed:.0f} s]"


class LineReporter(_Counting):
    """Plain lines for logs (output that is not a terminal): nothing for short work, then a line on a unit done
    at least `every_s` seconds after the last, and the final count at the finish of work that printed any and
    not that count yet (so `| tee` logs show long runs going, each count once)."""

    def __init__(self, console: Any = None, every_s: float = 30.0):
        super().__init__()
        self.console = console if console is not None else _stderr_console()
        self.every_s = every_s
        self.last = time.monotonic()
        self.printed: int | None = None  # the count last printed (None: no line yet)

    def start(self, label: str, total: int | None = None) -> None:
        self._start(label, total)
        self.last, self.printed = time.monotonic(), None

    def advance(self, n: int = 1, **fields: Any) -> None:
        self._advance(n, fields)
        if n > 0 and self.active and time.monotonic() - self.last >= self.every_s:
            self._print()

    def _print(self) -> None:
        self.last, self.printed = time.monotonic(), self.done
        self.console.print(self.line(), highlight=False, markup=False)

    def log(self, message: str) -> None:
        self.console.print(message, highlight=False)

    def finish(self, summary: str | None = None) -> None:
        if self.active and self.printed is not None and self.printed != self.done:
            self._print()
        self.active = False
        if summary:
            self.log(summary)

    def __enter__(self) -> LineReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False


class RichReporter(_Counting):
    """A rich live bar on a terminal: label, bar, done/total, fields, elapsed and time left. Use it as a
    context manager (the live display stops at the end, also on failure)."""

    def __init__(self, console: Any = None, transient: bool = True):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        super().__init__()
        self.console = console if console is not None else _stderr_console()
        self.bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                            TextColumn("left"), TimeRemainingColumn(), console=self.console, transient=transient)
        self.task: Any = None
        self.live = False

    def start(self, label: str, total: int | None = None) -> None:
        self._start(label, total)
        if not self.live:
            self.bar.start()
            self.live = True
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(label, total=total, stats="")

    def advance(self, n: int = 1, **fields: Any) -> None:
        self._advance(n, fields)
        if self.task is not None:
            self.bar.update(self.task, completed=self.done, stats=render_fields(self.shown))

    def log(self, message: str) -> None:
        self.console.print(message, highlight=False)

    def finish(self, summary: str | None = None) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
            self.task = None
        self.active = False
        if summary:
            self.log(summary)

    def close(self) -> None:
        if self.live:
            self.bar.stop()
            self.live = False

    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def terminal_reporter(enabled: bool = True, console: Any = None) -> QuietReporter | LineReporter | RichReporter:
    """The reporter a command shows its work with: a rich bar when `console` (default stderr) is a terminal,
    plain lines for long work when it is not, nothing when not `enabled`. Use it as a context manager."""
    if not enabled:
        return QUIET
    console = console if console is not None else _stderr_console()
    return RichReporter(console) if console.is_terminal else LineReporter(console)


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)
