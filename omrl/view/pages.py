"""The viewer's pages as HTML strings: Jinja2 templates with autoescape on, shared by the server and
the static export (which differ only in how links are spelled: `Links`)."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

from omrl.report import AGREEMENT_LOW, AGREEMENT_RULE, STEP_TABLE_ROWS
from omrl.view.data import SORTS, Group, ListPage, ShownTrajectory, search_available
from omrl.view.study_runs import study_runs, study_seeds

FOLD_CHARS = 1200  # messages longer than this are folded (<details>)
TOOL_FOLD_CHARS = 400  # observations fold sooner: they are what makes a thread long
CUT_CHARS = 20_000  # a longer text shows its start and a link to the whole: a 20 MB message is no 20 MB page
# The texts a page may cut, by field: a message's (at = its position; call = a tool call's index), an
# annotation's (at = its place in the page's list, newest first) and the trajectory's own.
MESSAGE_TEXTS = ("content", "reasoning", "arguments")
ANNOTATION_TEXTS = ("rationale", "annotation_error")
ROW_TEXTS = ("instruction", "error", "task", "tools", "metadata")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'none'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
# the same policy in each page's <meta> (what an exported file has); browsers ignore frame-ancestors there
META_CSP = CSP.replace("; frame-ancestors 'none'", "")


def file_key(key: str) -> str:
    """A file name for an id in an export (ids may hold any character)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def full_text_key(trajectory_id: str, field: str, at: int | None = None, call: int | None = None) -> str:
    """The file name (without .html) of one whole text's page in an export."""
    return "-".join([file_key(trajectory_id), field] + [f"{k}{v}" for k, v in (("at", at), ("call", call))
                                                          if v is not None])


class Links:
    """How pages link to each other: server URLs, or relative file names in an export.

    In an export only what was written has a link (`trajectories`, `groups`); other targets get None.
    """

    def __init__(self, export: bool = False, depth: int = 0, trajectories: set[str] | None = None,
                 groups: set[str] | None = None):
        self.export = export
        self.root = "../" * depth if export else "/"
        self.trajectories = trajectories
        self.groups = groups

    def at_depth(self, depth: int) -> Links:
        return Links(self.export, depth, self.trajectories, self.groups)

    def static(self, name: str) -> str:
        return f"{self.root}static/{name}"

    def home(self, **params: Any) -> str:
        if self.export:  # an export's list is paged into files: index.html, page-2.html, ...
            number = params.get("page") or 1
            return f"{self.root}index.html" if number == 1 else f"{self.root}page-{int(number)}.html"
        query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return "/" + (f"?{query}" if query else "")

    def runs(self) -> str:
        return f"{self.root}runs.html" if self.export else "/runs"

    def trajectory(self, trajectory_id: str | None) -> str | None:
        if not trajectory_id:
            return None
        if self.export:
            if self.trajectories is not None and trajectory_id not in self.trajectories:
                return None
            return f"{self.root}t/{file_key(trajectory_id)}.html"
        return "/t/" + quote(trajectory_id, safe="")

    def diff(self, a: str | None, b: str | None) -> str | None:
        """The comparison of two trajectories (served only: an export has no diff pages)."""
        if self.export or not a or not b:
            return None
        return "/diff?" + urlencode({"a": a, "b": b})

    def full_text(self, trajectory_id: str, field: str, at: int | None = None, call: int | None = None
                  ) -> str | None:
        """The page holding one whole text of a trajectory (see `text_of`), escaped like every page."""
        if self.export:
            if self.trajectories is not None and trajectory_id not in self.trajectories:
                return None
            return f"{self.root}t/{full_text_key(trajectory_id, field, at, call)}.html"
        params = {"field": field, "at": at, "call": call}
        return "/full/" + quote(trajectory_id, safe="") + "?" + urlencode(
            {k: v for k, v in params.items() if v is not None})

    def group(self, group_id: str | None) -> str | None:
        if not group_id:
            return None
        if self.export:
            if self.groups is not None and group_id not in self.groups:
                return None
            return f"{self.root}g/{file_key(group_id)}.html"
        return "/g/" + quote(group_id, safe="")


# ------------------------------------------------------------------------------------------ filters


def fmt(value: Any, digits: int = 4) -> str:
    """A number or value for a table cell ('—' for none)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def pretty_json(text: Any) -> str:
    """JSON text indented, or the text as it was when it is not JSON (a model may write anything) or too
    long to be shown whole (CUT_CHARS)."""
    if text is None or text == "":
        return ""
    if len(str(text)) > CUT_CHARS:
        return str(text)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, indent=2)
    except (TypeError, ValueError):
        return str(text)


def short(text: Any, n: int = 160) -> str:
    """The text on one line (runs of white space as one space), cut to `n` characters; only its first
    words are looked at, so a 20 MB text costs no more than a short one."""
    words, length = [], -1
    for match in re.finditer(r"\S+", "" if text is None else str(text)):
        words.append(match.group())
        length += len(words[-1]) + 1
        if length > n:
            break
    line = " ".join(words)
    return line if len(line) <= n else line[: n - 1] + "…"


def thousands(n: int) -> str:
    return f"{n:,}"


def text_of(row: ShownTrajectory, field: str, at: int | None = None, call: int | None = None) -> str | None:
    """One text of a trajectory row: a message's content, reasoning or tool call arguments (`at` its
    position, `call` the call's index), an annotation's rationale or error (`at` its place in
    row["annotations"]), or the row's own (instruction, error, task, tools, metadata). None: no such text."""
    def item(items: Any, index: int | None) -> dict[str, Any] | None:
        items = items or []
        return items[index] if isinstance(index, int) and 0 <= index < len(items) else None

    if field in ROW_TEXTS:
        value = row.get(field)
    elif field in MESSAGE_TEXTS:
        message = item(row.get("messages"), at)
        if message is None:
            return None
        if field == "arguments":
            tool_call = item(message.get("tool_calls"), call)
            value = None if tool_call is None else tool_call.get("arguments")
        else:
            value = message.get(field)
    elif field in ANNOTATION_TEXTS:
        note = item(row.get("annotations"), at)
        value = None if note is None else note.get("error" if field == "annotation_error" else "rationale")
    else:
        return None
    return None if value is None else str(value)


def long_texts(row: ShownTrajectory) -> list[tuple[str, int | None, int | None]]:
    """The (field, at, call) of each text of the row that its page cuts (longer than CUT_CHARS)."""
    found = [(field, None, None) for field in ROW_TEXTS]
    for at, message in enumerate(row.get("messages") or []):
        found += [("content", at, None), ("reasoning", at, None)]
        found += [("arguments", at, k) for k in range(len(message.get("tool_calls") or []))]
    for at in range(len(row.get("annotations") or [])):
        found += [("rationale", at, None), ("annotation_error", at, None)]
    return [address for address in found if len(text_of(row, *address) or "") > CUT_CHARS]


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("omrl.view", "templates"),
    autoescape=True,  # every template, whatever its name: all content is escaped
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(fmt=fmt, pretty_json=pretty_json, short=short, thousands=thousands)
_ENV.globals.update(FOLD_CHARS=FOLD_CHARS, TOOL_FOLD_CHARS=TOOL_FOLD_CHARS, CUT_CHARS=CUT_CHARS)


def render(template: str, links: Links, **context: Any) -> str:
    return _ENV.get_template(template).render(links=links, export=links.export, csp=META_CSP, **context)


# ---------------------------------------------------------------------------------------- the pages


def list_html(page: ListPage, links: Links, store_name: str) -> str:
    def sort_link(key: str) -> str:
        desc = not (page.sort == key and page.desc)
        return links.home(q=page.search, where=page.where, sort=key, dir="desc" if desc else "asc")

    def page_link(number: int) -> str:
        return links.home(q=page.search, where=page.where, sort=page.sort, dir="desc" if page.desc else "asc",
                          page=number)

    return render("list.html", links, page=page, store_name=store_name, sorts=list(SORTS),
                  sort_link=sort_link, page_link=page_link, search_box=search_available())


def _thread(row: ShownTrajectory) -> list[dict[str, Any]]:
    """The messages, each assistant message with its turn (reward, latency, tokens) and the notes the
    environment left on it (omrl.view.transcript.turn_notes) when it has one."""
    from omrl.view.transcript import turn_notes

    turns = {t.get("index"): t for t in row.get("turns") or []}
    out = []
    assistant = 0
    for position, message in enumerate(row.get("messages") or []):
        item = dict(message, position=position, turn=None)
        item["calls"] = [dict(c, pretty=pretty_json(c.get("arguments"))) for c in message.get("tool_calls") or []]
        if message.get("role") == "assistant":
            item["turn"] = turns.get(assistant)
            item["notes"] = turn_notes(item["turn"].get("info")) if item["turn"] else []  # a game's score...
            assistant += 1
        out.append(item)
    return out


def trajectory_html(row: ShownTrajectory, links: Links, store_name: str) -> str:
    """A trajectory's page: the conversation first (with its environment's own view, omrl.view.env_views, when
    the env has one), the row's metadata folded."""
    from omrl.view.env_views import env_view

    return render("trajectory.html", links, t=row, thread=_thread(row), view=env_view(row), store_name=store_name)


def group_html(group: Group, links: Links, store_name: str) -> str:
    scored = [r for r in group.rows if r.get("reward") is not None]
    best = max(scored, key=lambda r: r["reward"]) if scored else None
    return render("group.html", links, group=group, best=best, store_name=store_name)


def _message_text(message: dict[str, Any]) -> str:
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or []:
        parts.append(f"→ {call.get('name')}({call.get('arguments') or ''})")
    return "\n".join(p for p in parts if p)


def aligned_messages(a: ShownTrajectory, b: ShownTrajectory) -> list[dict[str, Any]]:
    """The two conversations aligned message by message (difflib over (role, text)): runs of equal
    messages, and changed, removed or added ones with both sides."""
    left = [(m.get("role"), _message_text(m)) for m in a.get("messages") or []]
    right = [(m.get("role"), _message_text(m)) for m in b.get("messages") or []]
    rows = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, left, right, autojunk=False).get_opcodes():
        if tag == "equal":
            rows.append({"tag": "equal", "count": i2 - i1, "first": i1, "messages": left[i1:i2]})
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            la = left[i1 + k] if i1 + k < i2 else None
            rb = right[j1 + k] if j1 + k < j2 else None
            rows.append({"tag": tag, "a": la, "b": rb, "a_pos": i1 + k if la else None,
                         "b_pos": j1 + k if rb else None})
    return rows


def diff_html(a: ShownTrajectory, b: ShownTrajectory, links: Links, store_name: str) -> str:
    fields = ["task_id", "env", "model", "round", "sample", "reward", "success", "status", "num_turns",
              "prompt_tokens", "completion_tokens", "duration_s", "source"]
    return render("diff.html", links, a=a, b=b, rows=aligned_messages(a, b), fields=fields, store_name=store_name)


def _bars(counts: list[dict[str, Any]], label: str, value: str, maximum: float | None = None) -> dict[str, Any]:
    """An SVG bar chart's geometry: one bar per entry of `counts` (no JS, no inline style: CSP allows none)."""
    values = [r.get(value) for r in counts]
    top = maximum or max([v for v in values if v is not None] or [1]) or 1
    width, row_height = 360, 22
    bars = []
    for i, (r, v) in enumerate(zip(counts, values, strict=True)):
        bars.append({"y": i * row_height, "w": 0 if v is None else max(1.0, width * float(v) / top),
                     "label": fmt(r.get(label)), "value": fmt(v, 3), "expert": bool(r.get("expert"))})
    return {"bars": bars, "height": max(row_height, len(bars) * row_height), "width": width}


def _lines(series: dict[str, list[tuple[float, float]]], lo: float | None = None,
           hi: float | None = None, guide: float | None = None) -> dict[str, Any]:
    """An SVG line chart's geometry: one polyline per series over a shared x (step) and y axis, and a
    dotted horizontal line at `guide` (a threshold) when given."""
    width, height, left, bottom = 420, 160, 44, 20
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0 = min(ys) if lo is None else lo
    y1 = max(ys) if hi is None else hi
    if y1 <= y0:  # a flat series still gets a visible band
        y0, y1 = y0 - 0.5, y1 + 0.5
    dx = (x1 - x0) or 1

    def at(x: float, y: float) -> str:
        return f"{left + (x - x0) / dx * (width - left - 8):.1f},{8 + (y1 - y) / (y1 - y0) * (height - bottom - 8):.1f}"

    lines = [{"label": label, "points": " ".join(at(x, y) for x, y in pts), "n": len(pts),
              "end": at(*pts[-1]).split(","), "last": fmt(pts[-1][1], 3)} for label, pts in series.items()]
    guide_y = None if guide is None else at(x0, guide).split(",")[1]
    return {"lines": lines, "width": width, "height": height, "legend": 16 * len(lines) + 4, "left": left,
            "guide": guide_y, "guide_label": fmt(guide, 3),
            "bottom": height - bottom, "x0": fmt(x0), "x1": fmt(x1), "y0": fmt(y0, 3), "y1": fmt(y1, 3)}


def _step_charts(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Success and reward per GRPO/PPO step, one line per run and round (None: no stored step)."""
    success: dict[str, list[tuple[float, float]]] = {}
    reward: dict[str, list[tuple[float, float]]] = {}
    for row in steps:
        label = f"{row['run']} · round {row['round']} ({row['kind']})"
        if row["success_rate"] is not None:
            success.setdefault(label, []).append((row["step"], row["success_rate"]))
        if row["mean_reward"] is not None:
            reward.setdefault(label, []).append((row["step"], row["mean_reward"]))
    if not success and not reward:
        return None
    return {"success": _lines(success, 0.0, 1.0) if success else None,
            "reward": _lines(reward) if reward else None}


def _agreement_chart(agreements: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The judge's Pearson r with the environment's reward per training step, a line per annotator, run
    and round (None: no step has an r)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in agreements:
        if row["pearson"] is not None:
            series.setdefault(f"{row['annotator']} · {row['run']} · round {row['round']}", []).append(
                (row["step"], row["pearson"]))
    return _lines(series, -1.0, 1.0, guide=AGREEMENT_LOW) if series else None


def runs_html(runs: dict[str, Any], links: Links, store_name: str, store_path: Any = None) -> str:
    """The runs page; a study's seed store (omrl study run) gets its runs grouped by method too."""
    charts = {key: _bars(rows, "name", "n") for key, rows in runs["counts"].items()}
    by_round = (runs.get("expert") or []) + runs["by_round"]  # the expert's bar first, apart from round 0
    success = _bars(by_round, "round", "success_rate", maximum=1.0)
    reward = _bars(by_round, "round", "mean_reward")
    return render("runs.html", links, runs=runs, charts=charts, success=success, reward=reward,
                  steps=_step_charts(runs.get("steps") or []), agreement_rule=AGREEMENT_RULE, store_name=store_name,
                  step_agreement=_agreement_chart(runs.get("step_agreement") or []),
                  step_table_rows=STEP_TABLE_ROWS, study=study_runs(runs["rounds"], store_path),
                  study_seeds=study_seeds(store_path))


def full_text_html(row: ShownTrajectory, field: str, at: int | None, call: int | None, links: Links,
                   store_name: str) -> str | None:
    """The page of one whole text of a trajectory (None: the row has no such text)."""
    text = text_of(row, field, at, call)
    if text is None:
        return None
    if field in MESSAGE_TEXTS:
        what = f"message #{at}: {'tool call ' + str(call) + ' arguments' if field == 'arguments' else field}"
        back = f"#m{at}"
    elif field in ANNOTATION_TEXTS:
        note = row["annotations"][at]
        what, back = f"annotation by {note.get('annotator')}: {field.replace('annotation_', '')}", "#annotations"
    else:
        what, back = field, "#payload" if field in ("task", "tools", "metadata") else ""
    home = links.trajectory(row["id"])
    return render("full.html", links, t=row, what=what, text=text, back=home + back if home else None,
                  store_name=store_name)


def error_html(message: str, links: Links, store_name: str, status: int = 404) -> str:
    return render("error.html", links, message=message, status=status, store_name=store_name)
