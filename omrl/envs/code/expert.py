"""The code expert's plan: run the tests, apply the task's recorded fix file by file, run the tests again."""

from __future__ import annotations

from omrl.envs.base import Action, Task


def expert_plan(task: Task) -> list[Action]:
    """The expert's moves for a task, in order (payload["fix"]: edits as whole files or replacements)."""
    plan = [Action(tool="run_tests")]
    for edit in task.payload.get("fix") or []:
        plan.append(Action(tool="read_file", arguments={"path": edit["path"]}))
        if "content" in edit:
            plan.append(Action(tool="write_file", arguments={"path": edit["path"], "content": edit["content"]}))
        else:
            plan.append(Action(tool="replace_in_file",
                               arguments={"path": edit["path"], "old": edit["old"], "new": edit["new"]}))
    plan.append(Action(tool="run_tests"))
    return plan
