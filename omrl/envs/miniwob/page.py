"""What the agent sees of a MiniWoB page: its visible elements with stable refs, as compact text.

One script (PAGE_SCRIPT) runs in the page and returns the task state (utterance, done, rewards) and the
elements an agent can see: rendered (a box of non-zero size, not display:none anywhere up the tree,
visibility visible, opacity above 0 up the tree) and either a control (inputs, buttons, links, labels,
selects, SVG shapes), or carrying text of their own, or else clickable (a click handler attribute, a
tabindex, role=button) or a painted leaf box (a colour swatch) with nothing listed inside. Containers
without text of their own are left out; their children are listed. The instruction bar (#query) and
MiniWoB's own overlays (reward display, start cover) are not part of the page. Each element gets a ref the first time it is
seen in an episode (the `data-omrl-ref` attribute), so refs stay the same while the episode lasts and
the same seed gives the same refs; `click(ref)` finds the element by that attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TEXT_LIMIT = 120  # characters of one element's text shown to the agent

# Runs in the page: returns {utterance, done, reward, raw_reward, reason, elements}. Only the task area
# (#area, MiniWoB's 160x210 px box below the yellow instruction) is listed.
PAGE_SCRIPT = r"""
const SKIP = new Set(['query', 'reward-display', 'sync-task-cover', 'click-canvas']);
const CONTROLS = new Set(['INPUT', 'TEXTAREA', 'SELECT', 'BUTTON', 'A', 'LABEL', 'SUMMARY']);
const SHAPES = new Set(['circle', 'rect', 'polygon', 'ellipse', 'path', 'line', 'polyline', 'text']);
if (window.__omrlNextRef === undefined) { window.__omrlNextRef = 1; }
function shown(el, style) {
  const rect = el.getBoundingClientRect();
  if (rect.width <= 0 || rect.height <= 0) return false;
  if (style.visibility !== 'visible') return false;
  for (let node = el; node && node !== document.body; node = node.parentElement) {
    if (parseFloat(getComputedStyle(node).opacity) === 0) return false;
  }
  return true;
}
function ownText(el) {
  if (el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement) return '';
  let text = '';
  for (const child of el.childNodes) {
    if (child.nodeType === Node.TEXT_NODE) text += ' ' + child.data;
  }
  return text.replace(/\s+/g, ' ').trim();
}
function control(el) {
  return CONTROLS.has(el.tagName.toUpperCase()) || el.isContentEditable
    || (el instanceof SVGElement && SHAPES.has(el.tagName.toLowerCase()));
}
function clickable(el) {
  return el.hasAttribute('onclick') || el.hasAttribute('tabindex') || el.getAttribute('role') === 'button';
}
function painted(style) {  // a box that shows as a coloured area (a colour swatch, a grid cell)
  const bg = style.backgroundColor;
  return bg && bg !== 'transparent' && !/rgba\(.*,\s*0\)$/.test(bg);
}
const elements = [];
// Lists el's visible elements in document order; returns whether it listed any (el or inside it).
function visit(el) {
  if (el.tagName === 'SCRIPT' || el.tagName === 'STYLE' || SKIP.has(el.id)) return false;
  const style = getComputedStyle(el);
  if (style.display === 'none') return false;
  const visible = shown(el, style);  // an invisible box may still hold visible children
  const slot = elements.length;
  let inside = false;
  if (!(el instanceof HTMLSelectElement)) {  // a select's options are listed with it
    for (const child of el.children) inside = visit(child) || inside;
  }
  if (!visible) return inside;
  const text = ownText(el);
  const leaf = el.children.length === 0;
  if (!(control(el) || text || (!inside && (clickable(el) || (leaf && painted(style)))))) return inside;
  const rect = el.getBoundingClientRect();
  const item = {node: el, tag: el.tagName.toLowerCase(), text: text,
                left: rect.left, top: rect.top, width: rect.width, height: rect.height};
  if (el instanceof HTMLInputElement) {
    item.type = el.type;
    if (el.type === 'checkbox' || el.type === 'radio') item.checked = el.checked;
    else item.value = el.value;
    if (el.placeholder) item.placeholder = el.placeholder;
  } else if (el instanceof HTMLTextAreaElement) {
    item.value = el.value;
  } else if (el instanceof HTMLSelectElement) {
    item.value = el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : '';
    item.options = Array.from(el.options).map(o => o.text);
  }
  if (el instanceof SVGElement) {
    const fill = el.getAttribute('fill') || style.fill;
    if (fill && fill !== 'none') item.color = fill;
  } else if (leaf && !text && !control(el) && painted(style)) {
    item.color = style.backgroundColor;
  }
  if (document.activeElement === el) item.focused = true;
  if (el.disabled) item.disabled = true;
  elements.splice(slot, 0, item);  // before its children: document order
  return true;
}
for (const child of document.body.children) visit(child);
for (const item of elements) {  // refs in document order, the first time an element is listed
  if (!item.node.dataset.omrlRef) item.node.dataset.omrlRef = String(window.__omrlNextRef++);
  item.ref = +item.node.dataset.omrlRef;
  delete item.node;
}
const query = document.getElementById('query');
return {utterance: query ? query.textContent.replace(/\s+/g, ' ').trim() : '',
        done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
        reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON), elements: elements};
"""

# Forget the refs of the last episode, so the same seed gives the same refs whatever came before.
CLEAR_REFS_SCRIPT = r"""
window.__omrlNextRef = 1;
document.querySelectorAll('[data-omrl-ref]').forEach(el => { delete el.dataset.omrlRef; });
"""


@dataclass
class Element:
    """One element the agent can see."""

    ref: int
    tag: str
    text: str = ""
    type: str | None = None  # input type
    value: str | None = None
    checked: bool | None = None
    options: list[str] = field(default_factory=list)
    placeholder: str | None = None
    color: str | None = None
    focused: bool = False
    disabled: bool = False
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # left, top, width, height in px

    @classmethod
    def from_script(cls, item: dict[str, Any]) -> Element:
        return cls(ref=int(item["ref"]), tag=str(item["tag"]), text=str(item.get("text") or ""),
                   type=item.get("type"), value=item.get("value"), checked=item.get("checked"),
                   options=[str(o) for o in item.get("options") or []], placeholder=item.get("placeholder"),
                   color=item.get("color"), focused=bool(item.get("focused")), disabled=bool(item.get("disabled")),
                   box=(item["left"], item["top"], item["width"], item["height"]))

    def describe(self) -> str:
        """`[ref] tag type "text" value="..." checked focused` on one line."""
        parts = [f"[{self.ref}]", self.tag]
        if self.type and self.type not in ("submit",):
            parts.append(self.type)
        if self.text:
            parts.append(_quote(self.text))
        if self.value is not None and self.tag != "select":
            parts.append(f"value={_quote(self.value)}")
        if self.placeholder:
            parts.append(f"placeholder={_quote(self.placeholder)}")
        if self.tag == "select":
            parts.append(f"selected={_quote(self.value or '')} options: " + " | ".join(map(_quote, self.options)))
        if self.checked is not None:
            parts.append("checked" if self.checked else "unchecked")
        if self.color:
            parts.append(f"color={self.color}")
        if self.focused:
            parts.append("focused")
        if self.disabled:
            parts.append("disabled")
        return " ".join(parts)


def _quote(text: str) -> str:
    text = text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 3] + "..."
    return '"' + text.replace('"', "'") + '"'


@dataclass
class PageState:
    """The task's state and its visible elements, as PAGE_SCRIPT reads them."""

    utterance: str
    done: bool
    reward: float
    raw_reward: float
    reason: str | None
    elements: list[Element]

    @classmethod
    def from_script(cls, data: dict[str, Any]) -> PageState:
        return cls(utterance=str(data.get("utterance") or ""), done=bool(data.get("done")),
                   reward=float(data.get("reward") or 0.0), raw_reward=float(data.get("raw_reward") or 0.0),
                   reason=data.get("reason"), elements=[Element.from_script(e) for e in data.get("elements") or []])

    def by_ref(self, ref: int) -> Element | None:
        return next((e for e in self.elements if e.ref == ref), None)

    def render(self) -> str:
        """The elements, one per line (what the agent reads after each action)."""
        if not self.elements:
            return "(the page shows no elements)"
        return "\n".join(e.describe() for e in self.elements)


READY_TRIES = 40  # x 50 ms: how long a task may take to say it is ready (WOB_TASK_READY)


def start_episode(driver: Any, seed: str, data_mode: str, time_limit_s: float | None) -> None:
    """Seed the task, set its data mode (and timer), start the episode, wait until the task says it is ready."""
    import time

    driver.execute_script(
        CLEAR_REFS_SCRIPT + "Math.seedrandom(arguments[0]); core.setDataMode(arguments[1]);"
        "if (arguments[2] !== null) { core.EPISODE_MAX_TIME = arguments[2]; }"
        "core.startEpisodeReal();", seed, data_mode, None if time_limit_s is None else int(time_limit_s * 1000))
    for _ in range(READY_TRIES):
        if driver.execute_script("return WOB_TASK_READY;"):
            return
        time.sleep(0.05)
    raise RuntimeError("the MiniWoB task did not get ready within 2 s")


def read_page(driver: Any) -> PageState:
    """The page as the agent sees it, read by PAGE_SCRIPT."""
    return PageState.from_script(driver.execute_script(PAGE_SCRIPT))
