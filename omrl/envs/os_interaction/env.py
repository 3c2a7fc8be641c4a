"""`os`: AgentBench's OS-interaction tasks in a persistent bash inside the sandbox; reward 1 when the answer checks.

Each episode gets one long-lived sandboxed shell (omrl.sandbox.SandboxShell): it looks like root (uid 0 in its
own user namespace, no capabilities), with writable tmpfs /root, /home and /etc (seeded with a Debian base's
users and groups, so `useradd`, `getent` and `groups` work), no network, and the sandbox's total memory cap.
The task's init script runs first, then its start script (its background processes live in the same
sandbox), then the agent's `bash` calls, until `answer` (or `commit`, for tasks checked by state).

Evaluation as AgentBench defines it: `match` compares the answer with the expected text; `check` is a list
where null runs the task's example script and appends its output to the parameters, and each checker then
judges (answer, expected): integer-match, string-match and size-match are omrl's own implementations of
AgentBench's checkers of those names. One difference, on purpose: AgentBench runs the example after the
agent acted, omrl before. At reset, right after the base system, init and start scripts and before the
agent's first command, the example runs in a fresh bash with a clean environment (`env -i`, no profile or
rc files), and its output is the expected answer; so deleting the data, or redefining the commands the
example uses (functions, aliases, PATH, traps, `enable -n`, BASH_ENV), cannot change what the answer is
compared with. An example that prints nothing or does not finish at reset is a setup failure (env_error),
never a score. (A check task whose answer depends on the agent's changes would need AgentBench's order; the
dev file has none.) When the shell ends during an episode (`exit`, a kill, its memory cap), the new shell
gets the task's setup again (base system, init, start) before the agent sees it: the observation says so
and the step's info has setup_rerun.

Tasks that need what this sandbox cannot give (a script file the data does not ship, `su` to another user,
the network) are refused by name: generation leaves them out and lists why, and reset raises InvalidTask.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl import sandbox
from omrl.envs.base import Action, InvalidTask, Reset, StepResult, Task, tool_schema
from omrl.envs.os_interaction.expert import expert_plan
from omrl.envs.os_interaction.tasks import agentbench_tasks, refusal
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.sandbox import limits as sandbox_limits

MAX_OBSERVATION_CHARS = 4_000
SYSTEM_PROMPT = ("You are an assistant operating a Linux shell as root. Use the bash tool to run commands; the "
                 "shell keeps its working folder and variables between calls. When you know the answer, call "
                 "answer with it (only the answer, as the task asks); when the task asks you to change the "
                 "system instead, call commit once you are done.")
TOOLS = [
    tool_schema("bash", "Run a bash command in the persistent shell and show its output and exit status.",
                {"command": {"type": "string", "description": "the command line (one or more lines)"}}),
    tool_schema("answer", "Give the final answer (ends the episode).", {"answer": {"type": "string"}}),
    tool_schema("commit", "Finish a task that asked for a change to the system (ends the episode).", {}),
]

# A Debian base system's users and groups (base-passwd), so the tasks' user and group questions have the
# population they were written against.
_PASSWD = """root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
bin:x:2:2:bin:/bin:/usr/sbin/nologin
sys:x:3:3:sys:/dev:/usr/sbin/nologin
sync:x:4:65534:sync:/bin:/bin/sync
games:x:5:60:games:/usr/games:/usr/sbin/nologin
man:x:6:12:man:/var/cache/man:/usr/sbin/nologin
lp:x:7:7:lp:/var/spool/lpd:/usr/sbin/nologin
mail:x:8:8:mail:/var/mail:/usr/sbin/nologin
news:x:9:9:news:/var/spool/news:/usr/sbin/nologin
uucp:x:10:10:uucp:/var/spool/uucp:/usr/sbin/nologin
proxy:x:13:13:proxy:/bin:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
backup:x:34:34:backup:/var/backups:/usr/sbin/nologin
list:x:38:38:Mailing List Manager:/var/list:/usr/sbin/nologin
irc:x:39:39:ircd:/run/ircd:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
_GROUPS = ("root:0 daemon:1 bin:2 sys:3 adm:4 tty:5 disk:6 lp:7 mail:8 news:9 uucp:10 man:12 proxy:13 kmem:15 "
           "dialout:20 fax:21 voice:22 cdrom:24 floppy:25 tape:26 sudo:27 audio:29 dip:30 www-data:33 backup:34 "
           "operator:37 list:38 irc:39 src:40 shadow:42 utmp:43 video:44 sasl:45 plugdev:46 staff:50 games:60 "
           "users:100 nogroup:65534")


@dataclass
class OsOptions:
    """OsEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    command_timeout_s: float = 30.0
    episode_timeout_s: float = 600.0
    memory_mb: int = 1024
    max_processes: int = 128
    disk_mb: int = 64


class OsEnv(ToolEnv):
    """AgentBench OS interaction: a persistent bash as root in the sandbox, answer or commit (AgentBench's checks)."""

    name = "os"
    options_class = OsOptions
    tools = TOOLS
    splits = ("dev",)
    required_payload = (("match", "check"),)  # the evaluation: a task without one cannot be scored
    payload_reader = ("AgentBench OS files are read whole by `omrl tasks import FILE --out TASKS` (format "
                      "agentbench_os) or `omrl tasks generate os --option source=FILE --out TASKS`")
    example_timeout_s = 60.0  # the example script's time at reset, when it computes a check task's expected answer

    @classmethod
    def resource_limits(cls) -> str:
        return (f"the whole shell: memory_mb=1024 ({sandbox_limits.memory_cap().description}), max_processes=128, "
                "disk_mb=64 per writable folder, command_timeout_s=30 per command, 600 s a whole episode")

    @classmethod
    def generate_tasks(cls, n: int | None = None, seed: int = 0, split: str = "dev",
                       source: str | None = None) -> list[Task]:
        """The runnable tasks of an AgentBench OS-interaction file (source=PATH; tasks.py)."""
        return agentbench_tasks(source, n, seed=seed, split=split)

    def __init__(self, command_timeout_s: float = 30.0, episode_timeout_s: float = 600.0, memory_mb: int = 1024,
                 max_processes: int = 128, disk_mb: int = 64) -> None:
        super().__init__()
        ok, reason = sandbox.sandbox_status()
        if not ok:
            raise sandbox.SandboxUnavailable(f"the os environment runs its shell in the sandbox: {reason}")
        self.command_timeout_s = float(command_timeout_s)
        self.limits = sandbox.SandboxLimits(timeout_s=float(episode_timeout_s), memory_mb=int(memory_mb),
                                            max_processes=int(max_processes), disk_mb=int(disk_mb))
        self.shell: sandbox.SandboxShell | None = None

    def reset(self, task: Task) -> Reset:
        self.close()
        super().__init__()
        reason = refusal(task.payload)
        if reason:
            raise InvalidTask(f"os task {task.id!r} needs {reason}")
        self.task, self._expected = task, None
        self.shell = sandbox.SandboxShell(limits=self.limits, env=_shell_env(), view=sandbox.SandboxView(
            writable=("/root", "/home", "/etc", "/var"), uid=0, project_dir="/root"))
        self._set_up()
        self._expected = self._expected_answer()  # before the agent's first command: see the module docstring
        self._plan = expert_plan(task.payload)
        return Reset(observation=task.payload.get("description") or task.instruction, tools=list(TOOLS),
                     system_prompt=SYSTEM_PROMPT)

    def _set_up(self) -> None:
        """Run the base system, then the task's init and start scripts, in the shell; raises when one fails."""
        groups = "".join(f"{name}:x:{gid}:\n" for name, gid in (g.split(":") for g in _GROUPS.split()))
        self._setup(f"cat > /etc/passwd <<'OMRL_EOF'\n{_PASSWD}OMRL_EOF\ncat > /etc/group <<'OMRL_EOF'\n{groups}"
                    "OMRL_EOF\nsed 's/:x:.*/:*:19000:0:99999:7:::/' /etc/passwd > /etc/shadow\n"
                    "sed 's/:x:.*/:*::/' /etc/group > /etc/gshadow\necho sandbox > /etc/hostname\n"
                    "mkdir -p /var/tmp /var/log\ncd /root", "the base system")
        payload = self.task.payload
        if payload.get("init"):
            self._setup(payload["init"], "the init script")
        if payload.get("start"):
            self._setup(payload["start"], "the start script", timeout_s=10)

    def _setup(self, script: str, what: str, timeout_s: float = 60.0) -> None:
        result = self.shell.run(script, timeout_s=timeout_s)
        if result.timed_out or result.restarted:
            raise RuntimeError(f"os task {self.task.id!r}: {what} did not finish: {result.output[-300:]}")

    def _expected_answer(self) -> str | None:
        """The example's output for a check task with a null entry (None otherwise); call it only while no
        agent command has run in the shell. Raises RuntimeError when the example prints nothing or hangs."""
        payload = self.task.payload
        if payload.get("match") is not None or None not in (payload.get("check") or []):
            return None
        # The shell is still the task's own here, so it may start the clean bash; the clean bash keeps the
        # example from what the init and start scripts may have left in the shell's variables or functions.
        result = self.shell.run(clean_bash(payload["example"]), timeout_s=self.example_timeout_s)
        if result.timed_out or result.restarted or not result.output.strip():
            raise RuntimeError(f"os task {self.task.id!r}: the example script gave no expected answer at reset "
                               f"(exit status {result.returncode}, timed out: {result.timed_out}): "
                               f"{result.output[-300:]!r}")
        return result.output

    def _restart(self) -> None:
        """A fresh shell with the task's setup run again (the old one ended: `exit`, a kill, its memory cap)."""
        self.shell.close()
        self._set_up()

    def close(self) -> None:
        super().close()
        shell, self.shell = self.shell, None
        if shell is not None:
            shell.close()

    # ---------------------------------------------------------------- tools

    def tool_bash(self, command: str) -> StepResult:
        if not isinstance(command, str) or not command.strip():
            raise InvalidAction("command must be a non-empty string")
        if "\0" in command:
            raise InvalidAction("the command contains a NUL character")
        rerun = not self.shell.alive  # it died between commands (a background kill): not a bare shell either
        if rerun:
            self._restart()
        result = self.shell.run(command, timeout_s=self.command_timeout_s)
        if result.restarted:  # the command ended the shell: the next command must meet the task's system again
            self._restart()
            rerun = True
        self._last_output = text = result.output
        if len(text) > MAX_OBSERVATION_CHARS:
            text = text[:MAX_OBSERVATION_CHARS // 2] + "\n...(cut)...\n" + text[-MAX_OBSERVATION_CHARS // 2:]
        if result.timed_out:
            text += f"\n(killed after {self.command_timeout_s:g} s)"
        elif result.returncode:
            text += f"\n(exit status {result.returncode})"
        if rerun:
            text += "\n(the shell restarted; the task's setup was run again)"
        return StepResult(observation=text or "(no output)",
                          info={"returncode": result.returncode, "timed_out": result.timed_out,
                                "shell_restarted": result.restarted, "setup_rerun": rerun})

    def tool_answer(self, answer: str) -> StepResult:
        if not isinstance(answer, str):
            raise InvalidAction("answer must be a string")
        return self._finish(answer)

    def tool_commit(self) -> StepResult:
        return self._finish(None)

    def _finish(self, answer: str | None) -> StepResult:
        passed, details = evaluate(self.task.payload, answer, self._expected)
        self.done = True
        return StepResult(observation="Correct." if passed else "Wrong.", reward=1.0 if passed else 0.0,
                          done=True, info={"success": passed, **details})

    def expert_action(self) -> Action:
        """The task's example solution where it has one (run it, answer its output), else the expected answer."""
        if self._plan:
            return self._plan.pop(0)
        return Action(tool="answer", arguments={"answer": self._last_output.strip()})

    _last_output = ""  # the last bash command's whole output: the expert answers with its example's
    _expected: str | None = None  # the example's output at reset, for check tasks


# ------------------------------------------------------------------------ evaluation


def _shell_env() -> dict[str, str]:
    """What the task's shell starts with besides the sandbox's base environment."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:" + sandbox.base_env()["PATH"]
    return {"HOME": "/root", "USER": "root", "PATH": path}


def clean_bash(script: str) -> str:
    """A command line running `script` in a new bash with only HOME, USER, PATH and LANG (no profile, no rc):
    nothing the calling shell defined (functions, aliases, traps, options, BASH_ENV) reaches it."""
    env = _shell_env()
    return (f"/usr/bin/env -i HOME={env['HOME']} USER={env['USER']} PATH={shlex.quote(env['PATH'])} LANG=C.UTF-8 "
            f"/bin/bash --noprofile --norc -c {shlex.quote(script)}")


def evaluate(payload: dict[str, Any], answer: str | None, expected: str | None) -> tuple[bool, dict]:
    """(passed, details) as AgentBench judges the task: match, or the check list with `expected` (the example's
    output, computed at reset) in place of its null entry."""
    if payload.get("match") is not None:
        return (answer is not None and answer.strip() == str(payload["match"]).strip()), {"checker": "match"}
    params = [answer if answer is not None else ""]
    details: dict[str, Any] = {}
    for item in payload["check"]:
        if item is None:
            if expected is None:
                raise RuntimeError("a check task's expected answer was not computed at reset")
            params.append(expected)
            details["expected"] = expected.strip()[:200]
            continue
        name = Path(item["file"]).name
        details["checker"] = name
        if not CHECKS[name](*params[:2]):
            return False, details
    return True, details


def integer_match(answer: str, expected: str) -> bool:
    try:
        return int(answer.strip()) == int(expected.strip())
    except ValueError:
        return False


def string_match(answer: str, expected: str) -> bool:
    return answer.strip() == expected.strip()


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)


def size_match(answer: str, expected: str) -> bool:
    """The same size once units are read (K, M, G... in powers of 1024, as `du -h` prints), within the
    precision the expected text shows."""
    sizes = [_SIZE.match(text) for text in (answer, expected)]
    if not all(sizes):
        return answer.strip() == expected.strip()
    powers = "KMGTP"
    (a, ua), (e, ue) = [(float(m.group(1)), m.group(2).upper()) for m in sizes]
    scale = {u: 1024 ** (powers.index(u) + 1) if u else 1 for u in (ua, ue)}
    step = 10 ** -len(sizes[1].group(1).partition(".")[2]) * scale[ue]
    return abs(a * scale[ua] - e * scale[ue]) <= step


CHECKS = {"integer-match.py": integer_match, "string-match.py": string_match, "size-match.py": size_match}


