"""The scripted MiniWoB expert: the next action from the utterance's fields and the visible page.

It reads only what an agent reads (the utterance, through the `miniwob` package's own field extractors,
and the listed elements) plus the actions it already took this episode, never the page's answer. One
small function per task; `next_action` refuses a task it does not know.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from omrl.envs.base import Action
from omrl.envs.miniwob.page import Element, PageState
from omrl.errors import UsageError

Solver = Callable[[dict[str, str], PageState, list[Action]], Action]


def click(element: Element) -> Action:
    return Action(tool="click", arguments={"ref": element.ref})


def type_into(element: Element, text: str) -> Action:
    return Action(tool="type", arguments={"ref": element.ref, "text": text})


def find(page: PageState, *, tag: str | None = None, text: str | None = None, type: str | None = None,
         nth: int = 0) -> Element:
    """The nth listed element matching tag / exact text / input type; a missing one is the solver's failure."""
    found = [e for e in page.elements if (tag is None or e.tag == tag) and (text is None or e.text == text)
             and (type is None or e.type == type)]
    if len(found) <= nth:
        raise LookupError(f"no element {tag or ''} {text!r} {type or ''} (#{nth}) on the page")
    return found[nth]


def submit(page: PageState, label: str = "Submit") -> Action:
    wanted = label.lower()
    return click(next(e for e in page.elements if e.tag == "button" and e.text.lower() == wanted))


def clicked(history: list[Action]) -> set[int]:
    return {a.arguments.get("ref") for a in history if a.tool == "click"}


def fill_then_submit(fields_and_values: list[tuple[Element, str]], page: PageState, button: str = "Submit") -> Action:
    """Type each value into its field when it is not there yet, then press the button."""
    for element, value in fields_and_values:
        if element.value != value:
            return type_into(element, value)
    return submit(page, button)


# ---------------------------------------------------------------- one function per task


def click_test(fields, page, history):
    return click(find(page, tag="button"))


def click_by_target(fields, page, history):
    return click(find(page, tag="button", text=fields["target"]))


def click_button_sequence(fields, page, history):
    return click(find(page, tag="button", text="TWO" if history else "ONE"))


def enter_text(fields, page, history):
    return fill_then_submit([(find(page, tag="input"), fields["target"])], page)


def enter_text_2(fields, page, history):
    text = fields["text"].upper() if fields["case"] == "upper" else fields["text"].lower()
    return fill_then_submit([(find(page, tag="input"), text)], page)


def enter_password(fields, page, history):
    boxes = [e for e in page.elements if e.tag == "input" and e.type == "password"]
    return fill_then_submit([(box, fields["target"]) for box in boxes], page)


def login_user(fields, page, history):
    return fill_then_submit([(find(page, tag="input", type="text"), fields["username"]),
                             (find(page, tag="input", type="password"), fields["password"])], page, "Login")


def focus_text(fields, page, history):
    return click(find(page, tag="input"))


def focus_text_2(fields, page, history):
    return click(find(page, tag="input", nth=int(fields["target"]) - 1))


def _label_input(page: PageState, label: Element) -> Element:
    """The checkbox or radio listed right after its label (the input sits inside the label)."""
    index = page.elements.index(label)
    following = page.elements[index + 1] if index + 1 < len(page.elements) else None
    if following is None or following.tag != "input":
        raise LookupError(f"no input after label {label.text!r}")
    return following


def click_checkboxes(fields, page, history):
    wanted = {v for k, v in fields.items() if k.startswith("target")}
    for label in (e for e in page.elements if e.tag == "label"):
        box = _label_input(page, label)
        if bool(box.checked) != (label.text in wanted):
            return click(box)
    return submit(page)


def click_option(fields, page, history):
    box = _label_input(page, find(page, tag="label", text=fields["target"]))
    return submit(page) if box.checked else click(box)


def click_link(fields, page, history):
    return click(find(page, text=fields["target"]))


def click_dialog(fields, page, history):
    return click(find(page, tag="button", text="Close"))


def click_dialog_2(fields, page, history):
    # The dialog's title-bar close button shows an "x" icon; its text is "Close".
    target = "Close" if fields["target"] == "x" else fields["target"]
    return click(find(page, tag="button", text=target))


def click_tab(fields, page, history):
    return click(find(page, tag="a", text=f"Tab #{fields['target']}"))


def choose_list(fields, page, history):
    menu = find(page, tag="select")
    if menu.value != fields["target"]:
        return Action(tool="select", arguments={"ref": menu.ref, "option": fields["target"]})
    return submit(page)


WIDGETS = {"button": ("button", None), "text": ("input", "text"), "textarea": ("textarea", None),
           "radio": ("input", "radio"), "checkbox": ("input", "checkbox")}


def click_widget(fields, page, history):
    tag, kind = WIDGETS[fields["target"]]
    return click(find(page, tag=tag, type=kind))


def click_collapsible(fields, page, history):
    header = find(page, tag="h3")
    return submit(page) if header.ref in clicked(history) else click(header)


def simple_arithmetic(fields, page, history):
    problem = next(e for e in page.elements if re.fullmatch(r"-?\d+ [-+x] -?\d+ =", e.text))
    a, op, b, _ = problem.text.split()
    answer = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    return fill_then_submit([(find(page, tag="input"), str(answer))], page)


SOLVERS: dict[str, Solver] = {
    "click-test": click_test, "click-test-2": click_by_target, "click-button": click_by_target,
    "unicode-test": click_by_target, "click-dialog-2": click_dialog_2,
    "click-button-sequence": click_button_sequence, "enter-text": enter_text, "enter-text-2": enter_text_2,
    "enter-password": enter_password, "login-user": login_user, "focus-text": focus_text,
    "focus-text-2": focus_text_2, "click-checkboxes": click_checkboxes, "click-option": click_option,
    "click-link": click_link, "click-dialog": click_dialog, "click-tab": click_tab, "choose-list": choose_list,
    "click-widget": click_widget, "click-collapsible": click_collapsible, "simple-arithmetic": simple_arithmetic,
}


def next_action(task: str, page: PageState | None, history: list[Action]) -> Action:
    """The expert's next action for MiniWoB task `task` on `page`."""
    solver = SOLVERS.get(task)
    if solver is None:
        raise UsageError(f"the scripted MiniWoB expert does not solve {task!r}; it solves {', '.join(sorted(SOLVERS))}")
    if page is None:
        raise UsageError("the episode has not started (reset first)")
    from miniwob.fields import get_field_extractor

    fields = dict(get_field_extractor(task)(page.utterance))
    return solver(fields, page, history)
