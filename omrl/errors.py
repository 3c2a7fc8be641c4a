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
