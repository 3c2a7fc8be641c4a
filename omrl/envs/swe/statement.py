"""A task's problem_statement: written by a model when one is configured, else (or when its reply fails) the template.

The model sees the package's name, the failing tests' names and their error lines, never the patch. A reply that
quotes one of the patch's changed lines would leak the fix: it is refused and the template used, the reason kept
beside the task (`problem_statement_source`, `problem_statement_error`), as is a call that failed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import omrl.envs.swe.bugs as bugs

MAX_ERROR_LINES = 40
MIN_LEAK_CHARS = 6  # a changed line shorter than this (`else:`, `)`) says nothing about the fix
SYSTEM_PROMPT = ("You write GitHub issues for a Python package. From the failing tests and their errors, describe "
                 "the misbehaviour a user sees: what was expected and what happens instead. Do not guess or propose "
                 "the code change. Reply with the issue text only.")


@dataclass(frozen=True)
class StatementModel:
    """An OpenAI-compatible model that writes the issue text; its key comes from the variable `api_key_env`."""

    model: str
    base_url: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 2


def error_lines(output: str) -> list[str]:
    """What pytest reported about the failures: its `E ...` lines and the FAILED/ERROR summary lines (capped)."""
    lines = [line.rstrip() for line in output.splitlines() if line.startswith(("E ", "FAILED ", "ERROR "))]
    return lines[:MAX_ERROR_LINES]


def changed_lines(patch: str) -> list[str]:
    """The lines a unified diff removes or adds, stripped, long enough to say something."""
    out = []
    for line in patch.splitlines():
        if line.startswith(("+++", "---")) or not line.startswith(("+", "-")):
            continue
        text = line[1:].strip()
        if len(text) >= MIN_LEAK_CHARS:
            out.append(text)
    return out


def leaked_line(text: str, patch: str) -> str | None:
    """The first changed line of `patch` that `text` quotes (whitespace-insensitive), or None."""
    flat = " ".join(text.split())
    return next((line for line in changed_lines(patch) if " ".join(line.split()) in flat), None)


def write(package: str, failing: list[str], output: str, patch: str,
          model: StatementModel | None) -> tuple[str, dict]:
    """(problem_statement, provenance): provenance has `problem_statement_source` ("template" or "model:NAME") and,
    when a configured model was not used, `problem_statement_error` saying why."""
    template = bugs.problem_statement(package, failing, output)
    if model is None:
        return template, {"problem_statement_source": "template"}
    from omrl.llm.client import LLMClient, LLMError

    tests = "\n".join(f"- {test}" for test in failing[:20])
    errors = "\n".join(error_lines(output))
    prompt = f"Package: {package}\n\nThese tests of its own suite fail:\n{tests}\n\nWhat pytest reports:\n{errors}\n"
    client = LLMClient(model.base_url, os.environ.get(model.api_key_env, "EMPTY"), timeout=model.timeout_s,
                       max_retries=model.max_retries, max_connections=1, adaptive=False)
    try:
        reply = client.chat_sync(model=model.model, temperature=0.0, messages=[
            {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}])
    except LLMError as exc:
        return template, {"problem_statement_source": "template",
                          "problem_statement_error": f"{model.model}: {type(exc).__name__}: {exc}"}
    text = (reply.choices[0].message.content or "").strip()
    leak = leaked_line(text, patch)
    why = ("the reply was empty" if not text else
           f"the reply quotes the fix's changed line {leak!r}" if leak is not None else None)
    if why is not None:
        return template, {"problem_statement_source": "template", "problem_statement_error": f"{model.model}: {why}"}
    return text, {"problem_statement_source": f"model:{model.model}"}
