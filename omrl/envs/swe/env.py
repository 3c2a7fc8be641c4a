"""`swe`: fix a bug injected into a real package's source, with SWE-agent-style tools inside the sandbox.

Tasks come from `generate_tasks(packages=[NAME==VERSION, ...])` (see tasks.py): each carries SWE-bench's
fields (instance_id, package, version, patch, FAIL_TO_PASS, PASS_TO_PASS, problem_statement) and the bug as
a patch on the pristine sdist tree. An episode copies the tree into a persistent sandboxed shell at /testbed
(the bug applied there, with git, so the agent's change is `git diff`), the package's test environment
read-only at /opt/omrl-env. Tools: bash, view (a numbered window of a file), str_replace, search, submit.
Submit scores the diff as SWE-bench's "resolved": in a fresh sandbox the bug and the diff are applied to the
pristine tree and every FAIL_TO_PASS and PASS_TO_PASS test must pass (per-test time limits); the counts go
to turns.info.
"""

from __future__ import annotations

import base64
import math
import random
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import omrl.envs.patch_guard as guard
import omrl.envs.swe.packages as packages
import omrl.envs.swe.testrun as testrun
from omrl import sandbox
from omrl.envs.base import Action, InvalidTask, Reset, StepResult, Task, tool_schema
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.errors import UsageError
from omrl.sandbox import limits as sandbox_limits

MAX_OBSERVATION_CHARS = 6_000
WINDOW = 100
TESTBED = "/testbed"
SYSTEM_PROMPT = ("You are fixing a bug in a Python package checked out at /testbed. Read the failing tests, find "
                 "the bug in the package's source, fix it with str_replace (or bash), check with the tests "
                 "(python3 -m pytest ...), then call submit. Do not edit the tests.")
TOOLS = [
    tool_schema("bash", "Run a bash command in /testbed (the shell persists between calls).",
                {"command": {"type": "string"}}),
    tool_schema("view", f"Show {WINDOW} numbered lines of a file, from start_line.",
                {"path": {"type": "string"}, "start_line": {"type": "integer"}}, required=["path"]),
    tool_schema("str_replace", "Replace the one exact occurrence of old_str in a file by new_str.",
                {"path": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"}}),
    tool_schema("search", "Search for a fixed string in the files under path (default: the whole checkout).",
                {"text": {"type": "string"}, "path": {"type": "string"}}, required=["text"]),
    tool_schema("submit", "Finish: your changes are scored by the package's tests.", {}),
]
_REPLACE = r"""
import base64, sys
path, old, new = sys.argv[1], *(base64.b64decode(a).decode() for a in sys.argv[2:4])
try:
    text = open(path, encoding="utf-8").read()
except (OSError, UnicodeDecodeError) as exc:
    sys.exit("cannot read %s: %s" % (path, exc))
count = text.count(old) if old else 0
if count != 1:
    sys.exit("old_str must occur exactly once in %s; it occurs %d times" % (path, count))
open(path, "w", encoding="utf-8").write(text.replace(old, new, 1))
print("Edited %s." % path)
"""


@dataclass
class SweOptions:
    """SweEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    command_timeout_s: float = 60.0
    episode_timeout_s: float = 1800.0


class SweEnv(ToolEnv):
    """SWE tasks from real package sdists: an injected bug, SWE-agent tools in the sandbox, SWE-bench's resolved."""

    name = "swe"
    options_class = SweOptions
    tools = TOOLS
    splits = ("test",)

    @classmethod
    def resource_limits(cls) -> str:
        return (f"the shell and each test run: memory_mb=2048 ({sandbox_limits.memory_cap().description}), "
                "max_processes=128, disk_mb=512; per_test_timeout_s=10 per test, command_timeout_s=60 a command")

    @classmethod
    def generate_tasks(cls, n: int | None = 20, seed: int = 0, split: str = "test", packages: list[str] | None = None,
                       workers: int = 2, per_test_timeout_s: float = 10.0, max_candidates: int | None = None,
                       report: dict | None = None, earlier: list[str] | None = None,
                       modifiers: str = "omrl", statement_model: str | None = None,
                       statement_base_url: str | None = None, statement_api_key_env: str = "OPENAI_API_KEY",
                       statement_timeout_s: float = 60.0) -> list[Task]:
        """Validated bug-fix tasks from the sdists of `packages` (NAME==VERSION or local .tar.gz), `earlier` their
        earlier releases to revert functions to, `modifiers` omrl's or SWE-smith's; see tasks.py. With
        `statement_model` and `statement_base_url` (an OpenAI-compatible endpoint, key from `statement_api_key_env`)
        a model writes each problem_statement from the failing tests (statement.py), else the template does."""
        from omrl.envs.swe.statement import StatementModel
        from omrl.envs.swe.tasks import generate

        if not packages:
            raise InvalidTask("swe tasks are made from package sources: give --package NAME==VERSION (repeatable)")
        if bool(statement_model) != bool(statement_base_url):
            raise InvalidTask("a model writes problem statements only with both --option statement_model=MODEL and "
                              "--option statement_base_url=URL")
        writer = StatementModel(str(statement_model), str(statement_base_url), str(statement_api_key_env),
                                float(statement_timeout_s)) if statement_model else None
        return generate(list(packages), n=n or 20, seed=seed, split=split, workers=int(workers),
                        per_test_timeout_s=float(per_test_timeout_s), max_candidates=max_candidates, report=report,
                        earlier=list(earlier or []), modifiers=str(modifiers), statement_model=writer)

    @classmethod
    def score_prediction(cls, task: Task, patch: str) -> dict[str, Any]:
        """SWE-bench's verdict on a model patch for one of omrl's instances (the fields `resolved` and counts)."""
        return evaluate_patch(task.payload, patch)

    def __init__(self, command_timeout_s: float = 60.0, episode_timeout_s: float = 1800.0) -> None:
        super().__init__()
        ok, reason = sandbox.sandbox_status()
        if not ok:
            raise sandbox.SandboxUnavailable(f"the swe environment runs everything in the sandbox: {reason}")
        self.command_timeout_s = float(command_timeout_s)
        self.limits = sandbox.SandboxLimits(timeout_s=float(episode_timeout_s), memory_mb=2048, max_processes=128,
                                            disk_mb=512, max_output_bytes=1 << 20)
        self.shell: sandbox.SandboxShell | None = None

    def reset(self, task: Task) -> Reset:
        self.close()
        super().__init__()
        payload = task.payload
        self.task = task
        self.package = task_package(task.id, payload)
        with testrun.work_folder("omrl-swe-") as work:
            tree = Path(work) / "tree"
            shutil.copytree(self.package.source, tree, symlinks=True)
            (tree / ".omrl-bug.patch").write_text(payload.get("bug_patch") or "", encoding="utf-8")
            self.shell = sandbox.SandboxShell(project=tree, limits=self.limits, env=_test_env(), view=sandbox.SandboxView(
                binds=((str(self.package.env), packages.ENV_INSIDE),), writable=(TESTBED,), project_dir=TESTBED))
            setup = self.shell.run(  # a SWE-bench checkout is buggy as it is: no bug patch
                "{ ! test -s .omrl-bug.patch || git apply .omrl-bug.patch; } && rm .omrl-bug.patch && git init -q && "
                "git add -A && git -c user.name=omrl -c user.email=omrl@localhost commit -qm base && echo ready",
                timeout_s=120)
        if setup.returncode != 0 or "ready" not in setup.output:
            raise InvalidTask(f"swe task {task.id!r}: its bug does not apply to {self.package.key}: "
                              f"{setup.output.strip()[-300:]}")
        self._plan = [Action(tool="view", arguments={"path": payload["fix_edit"]["path"]}),
                      Action(tool="str_replace", arguments={"path": payload["fix_edit"]["path"],
                                                            "old_str": payload["fix_edit"]["old"],
                                                            "new_str": payload["fix_edit"]["new"]})] \
            if payload.get("fix_edit") else _apply_with_bash(payload.get("patch") or "")
        return Reset(observation=payload.get("problem_statement") or task.instruction, tools=list(TOOLS),
                     system_prompt=SYSTEM_PROMPT)

    def close(self) -> None:
        super().close()
        shell, self.shell = self.shell, None
        if shell is not None:
            shell.close()

    # ---------------------------------------------------------------- tools

    def _run(self, command: str, timeout_s: float | None = None) -> sandbox.ShellResult:
        return self.shell.run(command, timeout_s=timeout_s or self.command_timeout_s)

    def tool_bash(self, command: str) -> StepResult:
        if not isinstance(command, str) or not command.strip() or "\0" in command:
            raise InvalidAction("command must be a non-empty string without NUL characters")
        result = self._run(command)
        text = _cap(result.output)
        if result.timed_out:
            text += f"\n(killed after {self.command_timeout_s:g} s)"
        elif result.returncode:
            text += f"\n(exit status {result.returncode})"
        return StepResult(observation=text or "(no output)", info={"returncode": result.returncode,
                                                                   "timed_out": result.timed_out})

    def tool_view(self, path: str, start_line: int = 1) -> StepResult:
        start = _line_number(start_line)
        script = (f"awk -v s={start} -v e={start + WINDOW - 1} 'NR>=s && NR<=e {{printf \"%6d  %s\\n\", NR, $0}} "
                  f"END {{printf \"(%d lines in all)\\n\", NR}}' {_path(path)}")
        result = self._run(script, 30)
        if result.returncode:
            raise InvalidAction(f"cannot view {path}: {result.output.strip()[-200:]}")
        return StepResult(observation=_cap(result.output))

    def tool_str_replace(self, path: str, old_str: str, new_str: str) -> StepResult:
        if not all(isinstance(v, str) for v in (path, old_str, new_str)):
            raise InvalidAction("path, old_str and new_str must be strings")
        try:
            encoded = [base64.b64encode(v.encode("utf-8")).decode() for v in (old_str, new_str)]
        except UnicodeEncodeError:
            raise InvalidAction("old_str and new_str must be valid text (no lone surrogates)") from None
        result = self._run(f"python3 -c {shlex.quote(_REPLACE)} {_path(path)} {encoded[0]} {encoded[1]}", 30)
        if result.returncode:
            raise InvalidAction(result.output.strip()[-300:] or f"cannot edit {path}")
        return StepResult(observation=result.output.strip())

    def tool_search(self, text: str, path: str = ".") -> StepResult:
        if not isinstance(text, str) or not text:
            raise InvalidAction("text must be a non-empty string")
        result = self._run(f"grep -rnIF --exclude-dir=.git -e {shlex.quote(text)} -- {_path(path)} | head -n 60", 30)
        return StepResult(observation=_cap(result.output) or "(no match)")

    def tool_submit(self) -> StepResult:
        diff = self._run("git add -A && git diff --cached --binary HEAD", 60)
        patch = diff.output if diff.returncode == 0 else ""
        verdict = evaluate_patch(self.task.payload, patch)
        self.done = True
        text = (f"Submitted. FAIL_TO_PASS {verdict['fail_to_pass']}, PASS_TO_PASS {verdict['pass_to_pass']}: "
                + ("resolved." if verdict["resolved"] else "not resolved."))
        if verdict.get("dropped_from_patch"):
            text += " Not scored (tests, pytest configuration and start-up hooks stay original): " + \
                ", ".join(verdict["dropped_from_patch"][:10]) + "."
        if verdict.get("forgery_signs"):
            text += " Refused: the patch reaches into the test runner or the interpreter."
        return StepResult(observation=text, reward=1.0 if verdict["resolved"] else 0.0, done=True,
                          info={"success": verdict["resolved"], **verdict, "model_patch": patch})

    def expert_action(self) -> Action:
        """The fix applied through the env's own edit tool (view, str_replace), then submit."""
        if self._plan:
            return self._plan.pop(0)
        return Action(tool="submit")

    def random_action(self, rng: random.Random) -> Action:
        return Action(tool=rng.choice(["search", "submit"]), arguments={"text": "def"} if rng.random() < 0.5 else {})


def evaluate_patch(payload: dict[str, Any], patch: str) -> dict[str, Any]:
    """SWE-bench's resolved for `patch` on the task's buggy tree, in a fresh sandbox: the patch without what
    touches the tests, pytest's configuration or start-up hooks (guard.py: dropped, and restored from the
    original inside the sandbox), then the task's test_patch; every FAIL_TO_PASS and PASS_TO_PASS test must pass
    in pytest's own report (a test missing from it has failed). A patch with signs of forging (guard.forgery_signs)
    is not resolved whatever the tests say."""
    package = task_package(str(payload.get("instance_id", "?")), payload)
    fail, keep = list(payload["FAIL_TO_PASS"]), list(payload["PASS_TO_PASS"])
    cleaned, dropped = guard.sanitise(patch or "", guard.tree_files(package.source))
    signs = guard.forgery_signs(cleaned)
    # SWE-bench's order: the model's patch, then the instance's test_patch (the tests the fix must pass)
    patches = [p for p in (payload.get("bug_patch"), cleaned) if p and p.strip()]
    run = testrun.run_tests(package, package.source, tests=sorted({t.split("::")[0] for t in fail + keep}),
                             per_test_timeout_s=float(payload.get("per_test_timeout_s", 10.0)), patches=patches,
                             test_patches=[payload.get("test_patch") or ""])
    passed = run.passed()
    fixed = sum(t in passed for t in fail)
    kept = sum(t in passed for t in keep)
    verdict = {"resolved": bool(fail) and fixed == len(fail) and kept == len(keep) and not signs,
               "fail_to_pass": f"{fixed}/{len(fail)}", "pass_to_pass": f"{kept}/{len(keep)}",
               "patch_applied": "OMRL: the patch does not apply" not in run.output, "test_seconds": run.seconds}
    if dropped or run.removed:
        verdict["dropped_from_patch"] = sorted(set(dropped) | set(run.removed))
    if signs:
        verdict["forgery_signs"] = signs[:10]
    if run.report_error:
        verdict["report_error"] = run.report_error
    return verdict


def task_package(task_id: str, payload: dict[str, Any]) -> packages.Package:
    """The package a task's tree comes from: its sdist (omrl's generated tasks) or, for an imported SWE-bench
    instance, its checkout at base_commit (`payload.source`, set by `omrl tasks import --source DIR`)."""
    swebench = "base_commit" in payload and "test_patch" in payload and "sdist" not in payload
    needed = ("FAIL_TO_PASS", "PASS_TO_PASS") if swebench else ("sdist", "bug_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
    for key in needed:
        if key not in payload:
            raise InvalidTask(f"swe task {task_id!r} has no payload.{key} (make tasks with "
                              "`omrl tasks generate swe --package NAME==VERSION`)")
    if not swebench:
        return packages.fetch(payload["sdist"], progress=lambda _: None)
    if not payload.get("source"):
        raise InvalidTask(f"SWE-bench instance {task_id}: no source tree; import it with `omrl tasks import "
                          f"--format swebench --source DIR` (DIR/{task_id}: {payload.get('repo')} checked out at "
                          f"{str(payload['base_commit'])[:12]})")
    named_otherwise = [t for t in list(payload["FAIL_TO_PASS"]) + list(payload["PASS_TO_PASS"]) if "::" not in str(t)]
    if named_otherwise:
        raise InvalidTask(f"SWE-bench instance {task_id}: its tests are not pytest node ids (e.g. "
                          f"{str(named_otherwise[0])[:60]!r}); omrl runs them with pytest only")
    try:
        return packages.from_checkout(payload["source"], str(payload.get("repo") or task_id),
                                      str(payload.get("version") or ""), str(payload["base_commit"]),
                                      progress=lambda _: None)
    except UsageError as exc:
        raise InvalidTask(f"SWE-bench instance {task_id}: {exc}") from None


def _apply_with_bash(patch: str) -> list[Action]:
    """The expert's way with a diff (an imported instance's fix): `git apply` through the env's bash tool."""
    if not patch.strip():
        return []
    encoded = base64.b64encode(patch.encode("utf-8")).decode()
    return [Action(tool="bash", arguments={"command": f"echo {encoded} | base64 -d | git apply --whitespace=nowarn"})]


def _test_env() -> dict[str, str]:
    return {"PYTHONPATH": f"{packages.ENV_INSIDE}:{TESTBED}/src:{TESTBED}", "HOME": "/tmp",
            "PATH": f"{packages.ENV_INSIDE}/bin:" + sandbox.base_env()["PATH"]}


def _path(path: Any) -> str:
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise InvalidAction("path must be a non-empty string")
    return shlex.quote(path if path.startswith(("/", "./")) or path == "." else f"./{path}")


def _line_number(value: Any) -> int:
    """A model's start_line as a line number from 1 (null: 1; "12" as 12); NaN, infinities, booleans and words
    are an invalid action, never a crash."""
    if value is None:
        return 1
    try:
        number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise InvalidAction(f"start_line must be a line number (from 1), not {str(value)[:40]!r}")
    return min(max(1, int(number)), 1 << 31)


def _cap(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    half = MAX_OBSERVATION_CHARS // 2
    return text[:half] + f"\n... ({len(text) - MAX_OBSERVATION_CHARS} characters cut) ...\n" + text[-half:]
