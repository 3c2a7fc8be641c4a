"""The errors omrl reports to a user.

Every error a user causes and can fix (bad input, a missing or foreign store, refused SQL, an unusable
recipe, policy or environment) derives from `OmrlError`, and the CLI prints it as one line. Any other
exception that reaches the CLI is a bug in omrl and prints its traceback; `omrl --debug VERB` prints the
traceback of user errors too. Each error keeps the built-in base it had (ValueError, RuntimeError), so
`except ValueError` in callers still works.

This module imports nothing from omrl: every other module may import it.
"""

from __future__ import annotations


class OmrlError(Exception):
    """Base of omrl's user-facing errors: the message says what is wrong and, where it can, how to fix it."""


class UsageError(OmrlError, ValueError):
    """A value given by the user (a flag, a spec, a setting) that omrl cannot use, when no more specific
    error (TaskError, RecipeError, ...) fits."""


# The top-level module -> the extra that brings it (pyproject.toml's optional-dependencies), for one clear line
# instead of a traceback when a command meets a missing optional package.
EXTRA_OF_MODULE = {
    "torch": "train", "transformers": "train", "trl": "train", "accelerate": "train", "peft": "train",
    "matplotlib": "train", "datasets": "train", "tokenizers": "train",
    "starlette": "view", "uvicorn": "view", "jinja2": "view",
    "ray": "ray", "scienceworld": "scienceworld", "textworld": "textworld", "textworld_express": "twx",
    "miniwob": "web", "selenium": "web", "gguf": "real-model",
}


def missing_extra(exc: ImportError) -> str | None:
    """For an import of a missing optional package, the line that names the extra to install; else None."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if not isinstance(exc, ModuleNotFoundError) or extra is None:
        return None
    return f"this needs {name}, which omrl's `{extra}` extra installs: pip install 'omrl[{extra}]'"
