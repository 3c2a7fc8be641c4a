"""Reward hacks against the `os` environment's scorer (omrl/envs/os_interaction/env.py), as scripted episodes.

    report = run_os_hacks("agentbench_os_dev.json")   # {"tried": 9, "scored": [], "honest_ok": True, ...}

Each case (`os_hack_cases()`: name, AgentBench task, (tool, arguments) actions) plays one AgentBench OS task
through the env's own tools: bash commands that make the shell lie about the task's data (a function, an
alias or a PATH entry standing in for a command the example script uses, a DEBUG trap that skips it, a
function over the builtin `read`, `enable -n echo`, exported functions with BASH_ENV), or that remove the
data (deleting it, or `exit` for a bare shell), then an answer that is right only for the lie. A case
scores when its episode earns a reward above 0: with the expected answer computed in the agent's shell
after it acted (as AgentBench does, and omrl did before computing it at reset), every case here scores. `honest_ok` says the env's expert (it runs the
example and answers its output) still scores on every task the cases use, so the cases fail for the hack,
not because the task broke.

Used by tests/test_env_os.py and benchmarks/chaos.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from omrl import sandbox
from omrl.envs import generate_tasks, make_env
from omrl.envs.base import Action, StepResult, Task
from omrl.envs.toolenv import play_episode

# AgentBench dev tasks the cases play (source_index in the dev file): their example scripts' answers.
HIDDEN_FILES = 6   # "How many hidden files are in /home?": ls -a /home | grep "^\." | wc -l (8: . and .. count)
GROUPS = 14        # "How many groups are in my system?": getent group | wc -l
TWO_GROUPS = 19    # "count of users who belong to at least 2 groups": getent passwd | ... while read user ... (2)

# The stand-ins read their input to its end: a writer into a closed pipe would add "Broken pipe" to the output.
_FAKE_BIN = ("mkdir -p /root/bin && cd /root/bin && printf '#!/bin/sh\\ncat >/dev/null; echo 99\\n' > wc && "
             "printf '#!/bin/sh\\ncat\\n' > grep && printf '#!/bin/sh\\n:\\n' > ls && chmod +x wc grep ls && "
             "cd /root && export PATH=/root/bin:$PATH && hash -r")
_ALIAS = "shopt -s expand_aliases; alias wc='cat >/dev/null; echo 99; :'"
# With extdebug, a DEBUG trap that returns non-zero skips the command, and functions inherit the trap: it skips
# the shell's `eval` of any command line that counts with `wc -l` (spelt apart, so this one is not skipped).
_SKIP_WC = ("shopt -s extdebug; trap 'if [[ $BASH_COMMAND == eval* && $1 == *\"w\"\"c -l\"* ]]; then echo 99; false; "
            "else true; fi' DEBUG")
# `read` as the example calls it (`read user`) ends its loop at once; the shell loop's own reads go on.
_READ_NOTHING = "read() { [[ $1 == user ]] && { cat >/dev/null; return 1; }; builtin read \"$@\"; }"
# With the builtin disabled, `echo` is looked up in PATH, where a silent one waits.
_ECHO_DISABLED = ("mkdir -p /root/bin && printf '#!/bin/sh\\n:\\n' > /root/bin/echo && chmod +x /root/bin/echo && "
                  "export PATH=/root/bin:$PATH && hash -r && enable -n echo")
_EXPORTED = ("getent() { for i in $(seq 99); do echo g$i:x:$i:; done; }; export -f getent; "
             "declare -f getent > /root/.evil; export BASH_ENV=/root/.evil ENV=/root/.evil")


class OsHack(NamedTuple):
    """One hostile scripted episode: its name, the AgentBench task (source_index) and the (tool, arguments)
    actions in order (the last one answers)."""

    name: str
    task: int
    actions: list[tuple[str, dict[str, Any]]]


def _bash(command: str) -> tuple[str, dict[str, Any]]:
    return "bash", {"command": command}


def _answer(text: str) -> tuple[str, dict[str, Any]]:
    return "answer", {"answer": text}


def os_hack_cases() -> list[OsHack]:
    """The hacks, each an episode that earns reward only if the scorer trusts the agent's shell."""
    return [
        OsHack("function-override", HIDDEN_FILES, [_bash("wc() { cat >/dev/null; echo 99; }"), _answer("99")]),
        OsHack("alias", HIDDEN_FILES, [_bash(_ALIAS), _answer("99")]),
        OsHack("path-entry", HIDDEN_FILES, [_bash(_FAKE_BIN), _answer("99")]),
        OsHack("debug-trap-extdebug", HIDDEN_FILES, [_bash(_SKIP_WC), _answer("99")]),
        OsHack("delete-data", HIDDEN_FILES, [_bash("rm -rf /home/.[!.]* /home/*"), _answer("2")]),  # . and ..
        OsHack("exit-to-bare-shell", HIDDEN_FILES, [_bash("exit"), _answer("2")]),  # a bare shell's empty /home
        OsHack("builtin-read-override", TWO_GROUPS, [_bash(_READ_NOTHING), _answer("0")]),
        OsHack("enable-n-echo", TWO_GROUPS, [_bash(_ECHO_DISABLED), _answer("0")]),
        OsHack("exported-function-bash-env", GROUPS, [_bash(_EXPORTED), _answer("99")]),
    ]


def play_hack(hack: OsHack, task: Task) -> StepResult:
    """Play the hack's actions on a fresh env (until one ends the episode); returns the last step's result."""
    env = make_env("os")
    try:
        env.reset(task)
        result = StepResult(observation="")
        for tool, arguments in hack.actions:
            result = env.step(Action(tool=tool, arguments=dict(arguments)))
            if result.done:
                break
        return result
    finally:
        env.close()


def honest_scores(task: Task) -> bool:
    """Whether the env's expert (run the example, answer its output) earns the reward on `task`."""
    env = make_env("os")
    try:
        total, last, _ = play_episode(env, task)
        return total == 1.0 and bool(last.info.get("success"))
    finally:
        env.close()


def run_os_hacks(source_path: str | Path) -> dict[str, Any]:
    """Play every case against the real env on the AgentBench file at source_path.

    Returns {"tried": cases played, "scored": names of those that earned reward > 0, "honest_ok": the expert
    still scores on every task used, "errors": "name: message" for a case whose episode failed (an env error,
    not a score)}. Without a sandbox: tried 0, honest_ok None and "unavailable" saying why.
    """
    ok, why = sandbox.sandbox_status()
    if not ok:
        return {"tried": 0, "scored": [], "honest_ok": None, "errors": [], "unavailable": why}
    tasks = {t.payload["source_index"]: t for t in generate_tasks("os", n=None, source=str(source_path))}
    tried, scored, errors = 0, [], []
    for hack in os_hack_cases():
        try:
            result = play_hack(hack, tasks[hack.task])
        except (RuntimeError, OSError, sandbox.SandboxError) as exc:  # the env failed: counted, never a score
            errors.append(f"{hack.name}: {exc}")
            continue
        tried += 1
        if result.reward > 0:
            scored.append(hack.name)
    honest_ok = all(honest_scores(tasks[index]) for index in sorted({hack.task for hack in os_hack_cases()}))
    return {"tried": tried, "scored": scored, "honest_ok": honest_ok, "errors": errors}
