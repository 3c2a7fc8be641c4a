"""`miniwob`: MiniWoB++ web tasks (the `miniwob` 1.1.0 package's HTML pages) in a real headless Chromium.

    omrl tasks generate miniwob --n 500 --option tasks=click-test,enter-text --split test --out web.jsonl
    omrl collect --env miniwob --tasks web.jsonl --policy openai:MODEL --env-option time_limit_s=60 ...

- The instruction is the task's utterance (read from the page at generation: the seed fixes it). The
  agent sees the page as its visible elements with refs (omrl/envs/miniwob/page.py) and acts with
  click(ref), type(ref, text), press(key), select(ref, option) and scroll(direction, ref).
- Reward and success are MiniWoB's: the page's reward when the episode ends (a positive reward scaled
  by the time left on the task's timer, -1 for a wrong answer or a timeout); success is a raw reward of
  1 (the binary reward most publications report). The raw reward and the page's reason are in the
  step's info. `time_limit_s` replaces the task's own timer (10 s for most tasks), for slow policies.
- One browser per environment instance, started once and reused (reusable = True: the episode runner
  pools instances, one per episode in flight); each reset reloads the task page, clears the refs and
  seeds the task, so an episode never depends on the one before. A browser that crashed fails its
  episode as env_error and the runner replaces it. Processes never outlive the command (browser.py).
- Tasks are train/test by seed: a task's seed is "SPLIT:SEED:K", so splits never share one; MiniWoB's
  data mode (a few tasks draw other data for "test") follows the split. Flight tasks (their own server)
  are left out.
- `screenshots=True` stores a PNG of the task area (data URI) in each step's info, beside the turn.
- The scripted expert (expert.py) solves a subset of tasks from the utterance's fields and the page.
"""

from __future__ import annotations

import importlib.util
import random
import re
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.miniwob.page import PageState, read_page, start_episode
from omrl.envs.miniwob.tasks import SPLITS, generate, html_dir, task_url
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.errors import UsageError

SYSTEM_PROMPT = (
    "You operate a web page in a browser to complete the task. The page is shown as its visible elements, "
    "one per line: [ref] tag \"text\" and its state (value=, checked, selected=, focused). Act with one tool "
    "call per step: click(ref), type(ref, text) (replaces the field's text), press(key) (Enter, Tab, "
    "Backspace, ArrowDown, Control+a, ...), select(ref, option), scroll(direction, ref). The task ends when "
    "it is done or failed; finishing sooner earns more reward.")
_REF = {"type": "integer", "description": "the element's ref, the number in [brackets]"}
TOOLS = [
    tool_schema("click", "Click an element.", {"ref": _REF}),
    tool_schema("type", "Type text into an input field (its current text is replaced).",
                {"ref": _REF, "text": {"type": "string"}}),
    tool_schema("press", "Press a key on the focused element: a key name (Enter, Tab, Backspace, Escape, "
                "ArrowUp, ArrowDown, ArrowLeft, ArrowRight, Space, Delete, Home, End, PageUp, PageDown), "
                "a character, or a combination such as Control+a.", {"key": {"type": "string"}}),
    tool_schema("select", "Choose an option of a select (drop-down) element by its text.",
                {"ref": _REF, "option": {"type": "string"}}),
    tool_schema("scroll", "Scroll the page, or a scrollable element, up or down.",
                {"direction": {"type": "string", "enum": ["up", "down"]}, "ref": _REF}, required=["direction"]),
]
KEYS = {"enter": "ENTER", "return": "RETURN", "tab": "TAB", "backspace": "BACKSPACE", "escape": "ESCAPE",
        "esc": "ESCAPE", "arrowup": "ARROW_UP", "arrowdown": "ARROW_DOWN", "arrowleft": "ARROW_LEFT",
        "arrowright": "ARROW_RIGHT", "up": "ARROW_UP", "down": "ARROW_DOWN", "left": "ARROW_LEFT",
        "right": "ARROW_RIGHT", "space": "SPACE", "delete": "DELETE", "home": "HOME", "end": "END",
        "pageup": "PAGE_UP", "pagedown": "PAGE_DOWN"}
MODIFIERS = {"control": "CONTROL", "ctrl": "CONTROL", "shift": "SHIFT", "alt": "ALT", "meta": "META",
             "cmd": "META"}
SCROLL_PX = 50  # MiniWoB's own scroll step
# A point of the element that is not covered by another one, as an offset from its centre (None: none).
VISIBLE_POINT_SCRIPT = r"""
const el = arguments[0], r = el.getBoundingClientRect(), steps = 8;
for (let i = 1; i < steps; i++) {
  for (let j = 1; j < steps; j++) {
    const x = r.left + r.width * i / steps, y = r.top + r.height * j / steps, hit = document.elementFromPoint(x, y);
    if (hit && (hit === el || el.contains(hit))) {
      return [Math.round(x - (r.left + r.width / 2)), Math.round(y - (r.top + r.height / 2))];
    }
  }
}
return null;
"""


@dataclass
class MiniWoBOptions:
    """MiniWoBEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    time_limit_s: float | None = None
    screenshots: bool = False
    start_timeout_s: float = 90.0


class MiniWoBEnv(ToolEnv):
    """MiniWoB++ web tasks in headless Chromium: click/type/press/select/scroll on the page's elements; MiniWoB's reward."""

    name = "miniwob"
    options_class = MiniWoBOptions
    tools = TOOLS
    splits = SPLITS
    reusable = True

    def __init__(self, time_limit_s: float | None = None, screenshots: bool = False,
                 start_timeout_s: float = 90.0) -> None:
        super().__init__()
        from omrl.envs.miniwob.browser import Browser

        if time_limit_s is not None and float(time_limit_s) <= 0:
            raise UsageError(f"miniwob time_limit_s must be positive, got {time_limit_s}")
        self.time_limit_s = None if time_limit_s is None else float(time_limit_s)
        self.screenshots = screenshots in (True, "true", "1", 1)
        self.engine = Browser(start_timeout=start_timeout_s)  # `engine`, as in every engine environment
        self.page: PageState | None = None
        self.task: Task | None = None
        self.history: list[Action] = []

    @classmethod
    def unavailable(cls) -> str | None:
        from omrl.envs.miniwob.browser import chromedriver_path, chromium_path

        if importlib.util.find_spec("selenium") is None or html_dir() is None:
            return "needs the miniwob and selenium packages: pip install 'omrl[web]'"
        if not chromium_path() or not chromedriver_path():
            return ("needs Chromium and its driver: apt-get install chromium chromium-driver "
                    "(or `make system-deps`)")
        return None

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", tasks: str | list[str] | None = None,
                       ) -> list[Task]:
        """n tasks, round-robin over `tasks` (comma-separated names, "all" or "scripted"; default all); tasks.py."""
        return generate(n, seed=seed, split=split, tasks=tasks)

    # ---------------------------------------------------------------- episode

    def reset(self, task: Task) -> Reset:
        super().__init__()
        name = task.payload.get("task")
        seed = task.payload.get("seed")
        if not isinstance(name, str) or seed is None:
            raise UsageError(f"miniwob task {task.id!r}: its payload needs the MiniWoB task name and seed")
        self.task, self.history = task, []
        driver = self.engine.driver
        driver.get(task_url(name))  # a fresh page each episode: nothing carries over from the last one
        start_episode(driver, str(seed), str(task.payload.get("data_mode") or "train"), self.time_limit_s)
        self.page = read_page(driver)
        head = f"Task: {self.page.utterance}"
        if task.instruction and self.page.utterance != task.instruction:
            head += f"\n(The task file's instruction was: {task.instruction})"
        return Reset(observation=f"{head}\n\nThe page:\n{self.page.render()}", tools=list(TOOLS),
                     system_prompt=SYSTEM_PROMPT)

    def step(self, action: Action) -> StepResult:
        result = super().step(action)
        if not result.info.get("invalid_action"):
            self.history.append(action)
        if self.screenshots:
            result.info["screenshot"] = self._screenshot()
        return result

    def _act(self, ref: Any, what: str, perform) -> StepResult:
        """Run `perform(element)` on the listed element `ref` (None: no element), then read the page; the
        episode ends when the task is done, also when its timer ran out before the action."""
        from selenium.common.exceptions import (
            ElementClickInterceptedException,
            ElementNotInteractableException,
            InvalidElementStateException,
            StaleElementReferenceException,
        )

        number = None if ref is None else _ref_number(ref)
        element = None
        if ref is not None:
            if number is None:
                raise InvalidAction(f"ref must be the number of a listed element, got {ref!r}")
            if self.page is None or self.page.by_ref(number) is None:
                raise InvalidAction(f"there is no element [{number}] on the page; use a ref from the list")
            done, element = self.engine.driver.execute_script(
                "return [WOB_DONE_GLOBAL, document.querySelector('[data-omrl-ref=\"' + arguments[0] + '\"]')];",
                number)
            if done:
                return self._finished("The task had already ended before this action.")
            if element is None:
                raise InvalidAction(f"element [{number}] is gone from the page")
        elif self.engine.driver.execute_script("return WOB_DONE_GLOBAL;"):
            return self._finished("The task had already ended before this action.")
        try:
            perform(element)
        except ElementClickInterceptedException:
            raise InvalidAction(f"[{number}] is covered by another element; it cannot be clicked now") from None
        except (ElementNotInteractableException, InvalidElementStateException):
            raise InvalidAction(f"[{number}] cannot be used that way ({what})") from None
        except StaleElementReferenceException:
            raise InvalidAction(f"element [{number}] is gone from the page") from None
        self.page = read_page(self.engine.driver)
        if self.page.done:
            return self._finished(f"Done: {what}.")
        return StepResult(observation=f"Done: {what}.\n\nThe page:\n{self.page.render()}")

    def _finished(self, head: str) -> StepResult:
        page = self.page = read_page(self.engine.driver)
        self.done = True
        success = page.raw_reward >= 1.0
        outcome = "success" if success else (page.reason or "failed")
        return StepResult(observation=f"{head}\nThe task ended: reward {page.reward:.2f} ({outcome}).",
                          reward=page.reward, done=True,
                          info={"success": success, "raw_reward": page.raw_reward, "reason": page.reason,
                                "note": f"MiniWoB reward {page.reward:.2f} (raw {page.raw_reward:g}, {outcome})"})

    # ---------------------------------------------------------------- tools

    def tool_click(self, ref: Any) -> StepResult:
        return self._act(ref, f"clicked [{_ref_number(ref)}]", self._click)

    def _click(self, element: Any) -> None:
        """A mouse click at the element's centre, or, when something covers the centre, at a point of it
        that shows (as a person clicks the visible part of a half-covered button)."""
        from selenium.common.exceptions import ElementClickInterceptedException
        from selenium.webdriver.common.action_chains import ActionChains

        try:
            element.click()
        except ElementClickInterceptedException:
            offset = self.engine.driver.execute_script(VISIBLE_POINT_SCRIPT, element)
            if offset is None:
                raise
            ActionChains(self.engine.driver).move_to_element_with_offset(element, *offset).click().perform()

    def tool_type(self, ref: Any, text: Any) -> StepResult:
        text = "" if text is None else str(text)

        def perform(element: Any) -> None:
            element.clear()
            element.send_keys(text)

        return self._act(ref, f"typed {text!r} into [{_ref_number(ref)}]", perform)

    def tool_press(self, key: Any) -> StepResult:
        keys = _key_sequence(str(key or ""))

        def perform(_: Any) -> None:
            from selenium.webdriver.common.action_chains import ActionChains

            chain = ActionChains(self.engine.driver)
            *modifiers, last = keys
            for modifier in modifiers:
                chain.key_down(modifier)
            chain.send_keys(last)
            for modifier in reversed(modifiers):
                chain.key_up(modifier)
            chain.perform()

        return self._act(None, f"pressed {key}", perform)

    def tool_select(self, ref: Any, option: Any) -> StepResult:
        listed = self.page.by_ref(_ref_number(ref) or -1) if self.page else None
        if listed is not None and listed.tag != "select":
            raise InvalidAction(f"[{listed.ref}] is a {listed.tag}, not a select; click it instead")
        if listed is not None and str(option) not in listed.options:
            raise InvalidAction(f"[{listed.ref}] has no option {option!r}; its options: "
                                + ", ".join(map(repr, listed.options)))

        def perform(element: Any) -> None:
            from selenium.webdriver.support.ui import Select

            Select(element).select_by_visible_text(str(option))

        return self._act(ref, f"selected {option!r} in [{_ref_number(ref)}]", perform)

    def tool_scroll(self, direction: Any, ref: Any = None) -> StepResult:
        if direction not in ("up", "down"):
            raise InvalidAction(f"scroll direction must be 'up' or 'down', got {direction!r}")
        amount = SCROLL_PX if direction == "down" else -SCROLL_PX
        driver = self.engine.driver

        def perform(element: Any) -> None:
            if element is None:
                driver.execute_script("window.scrollBy(0, arguments[0]);", amount)
            else:
                driver.execute_script("arguments[0].scrollBy(0, arguments[1]);", element, amount)

        where = f" [{_ref_number(ref)}]" if ref is not None else ""
        return self._act(ref, f"scrolled{where} {direction}", perform)

    # ---------------------------------------------------------------- policies, screenshots, cleanup

    def expert_action(self) -> Action:
        """The scripted solver's next move (expert.py); tasks it does not know get a clear error."""
        from omrl.envs.miniwob.expert import next_action

        return next_action(self.task.payload["task"], self.page, self.history)

    def random_action(self, rng: random.Random) -> Action:
        """A uniformly random tool call on a random listed element (random words for typing)."""
        elements = self.page.elements if self.page else []
        if not elements:
            return Action(tool="press", arguments={"key": rng.choice(["Enter", "Tab"])})
        element = rng.choice(elements)
        kind = rng.choice(["click", "click", "type", "press", "select", "scroll"])
        if kind == "type" and element.tag in ("input", "textarea"):
            return Action(tool="type", arguments={"ref": element.ref, "text": rng.choice(
                ["a", "hello", "1", "Submit", element.text or "x"])})
        if kind == "select" and element.tag == "select" and element.options:
            return Action(tool="select", arguments={"ref": element.ref, "option": rng.choice(element.options)})
        if kind == "press":
            return Action(tool="press", arguments={"key": rng.choice(["Enter", "Tab", "ArrowDown", "Space"])})
        if kind == "scroll":
            return Action(tool="scroll", arguments={"direction": rng.choice(["up", "down"])})
        return Action(tool="click", arguments={"ref": element.ref})

    def _screenshot(self) -> str:
        """The task area (#wrap, MiniWoB's 160x210 px box) as a PNG data URI."""
        from selenium.webdriver.common.by import By

        return "data:image/png;base64," + self.engine.driver.find_element(By.ID, "wrap").screenshot_as_base64

    def close(self) -> None:
        super().close()
        self.engine.close()


def _ref_number(ref: Any) -> int | None:
    """A ref as the agent may write it: 3, "3" or "[3]"; None when absent or not a number."""
    if isinstance(ref, bool):
        return None
    if isinstance(ref, int):
        return ref
    match = re.fullmatch(r"\s*\[?\s*(\d+)\s*\]?\s*", str(ref)) if ref is not None else None
    return int(match.group(1)) if match else None


def _key_sequence(key: str) -> list[str]:
    """"Control+a" -> [CONTROL, "a"]; named keys become selenium's key codes; refuses unknown names."""
    from selenium.webdriver.common.keys import Keys

    parts = [p for p in key.split("+")] if len(key) > 1 else [key]
    if not key or any(not p for p in parts):
        raise InvalidAction(f"press needs a key name or a character, got {key!r}")
    out = []
    for i, part in enumerate(parts):
        lower = part.lower()
        if i < len(parts) - 1:
            if lower not in MODIFIERS:
                raise InvalidAction(f"{part!r} is not a modifier (Control, Shift, Alt, Meta)")
            out.append(getattr(Keys, MODIFIERS[lower]))
        elif len(part) == 1:
            out.append(part)
        elif lower in KEYS:
            out.append(getattr(Keys, KEYS[lower]))
        else:
            raise InvalidAction(f"unknown key {part!r}; keys: {', '.join(sorted(KEYS))}, or one character")
    return out
