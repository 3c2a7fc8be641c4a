"""The one redaction of secrets from what omrl stores, logs and prints.

    remember_secret(api_key)                 # a key omrl was given (a flag, a recipe's environment variable)
    redact("HTTP 401: Bearer sk-abc...")     # -> "HTTP 401: Bearer ***"
    display_url("http://bob:pw@host/v1")     # -> "http://***@host/v1"

Hidden wherever they appear: every secret remembered in this process (LLMClient remembers its API key and
the user and password of its base URL, with the base64 form HTTP Basic auth sends), the values of
environment variables whose names say they hold one (OPENAI_API_KEY, *_API_KEY, *_TOKEN, *_SECRET,
*_PASSWORD, *_SECRET_ACCESS_KEY), and whatever is shaped like a credential: `Bearer <token>` and
`Basic <base64>`, a URL's user info (`scheme://user:password@`) and `sk-...` keys with a digit. Values shorter than MIN_SECRET characters ("EMPTY", "x": what local servers
accept) are placeholders, not secrets.

Applied by: omrl.llm.client (every LLMError, so the policy's, the judge's and the paraphraser's failures), the
`error` column of trajectories and annotations in omrl.schema (whatever wrote the row), and the CLI's
consoles, error lines and warnings (omrl.cli.common).
"""

from __future__ import annotations

import base64
import os
import re
import threading
from urllib.parse import unquote, urlsplit, urlunsplit

MIN_SECRET = 8
MASK = "***"

_remembered: set[str] = set()
_lock = threading.Lock()
_SECRET_ENV = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|SECRET_ACCESS_KEY)$", re.IGNORECASE)
# Shapes of credentials, whatever their source (an endpoint that echoes a header, a log line). Kept narrow:
# the consoles show stored data through this too, and ordinary words must survive.
_PATTERNS = [
    (re.compile(r"\b(Bearer\s+)[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE), r"\1" + MASK),
    (re.compile(r"\b(Basic\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}", re.IGNORECASE), r"\1" + MASK),
    (re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s@:?#]*(?::[^/\s@?#]*)?@", re.IGNORECASE), r"\1" + MASK + "@"),
    (re.compile(r"\bsk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{12,}"), "sk-" + MASK),
]
_cache: tuple[frozenset[str], re.Pattern[str] | None] = (frozenset(), None)


def remember_secret(value: str | None) -> None:
    """Hide `value` from everything omrl stores, logs and prints from now on."""
    if not isinstance(value, str) or len(value) < MIN_SECRET:
        return
    with _lock:
        _remembered.add(value)


def remember_url(url: str | None) -> None:
    """Remember the user name and password a URL carries (and their HTTP Basic form) as secrets."""
    if not url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if parts.username is None and parts.password is None:
        return
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    for value in (user, password, f"{user}:{password}"):
        remember_secret(value)
    remember_secret(base64.b64encode(f"{user}:{password}".encode()).decode())


def _secrets() -> frozenset[str]:
    found = {value for name, value in os.environ.items() if _SECRET_ENV.search(name) and len(value) >= MIN_SECRET}
    with _lock:
        found |= _remembered
    return frozenset(found)


def _secret_pattern() -> re.Pattern[str] | None:
    global _cache
    secrets = _secrets()
    if secrets != _cache[0]:
        # Longest first, so a secret that contains another is hidden whole.
        alternatives = sorted(secrets, key=len, reverse=True)
        _cache = (secrets, re.compile("|".join(map(re.escape, alternatives))) if alternatives else None)
    return _cache[1]


def redact(text: str | None) -> str | None:
    """`text` with every known secret and every credential-shaped string replaced by ***."""
    if not text:
        return text
    # A text shorter than any secret holds none: skip the environment scan (a row's "{}" metadata, per row).
    pattern = _secret_pattern() if len(text) >= MIN_SECRET else None
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for shape, replacement in _PATTERNS:
        text = shape.sub(replacement, text)
    return text


def display_url(url: str | None) -> str | None:
    """A URL as it may be shown or stored: without the user name and password it carries."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    if parts.username is None and parts.password is None:
        return redact(url)
    host = parts.hostname or ""
    netloc = f"{MASK}@{host}" + (f":{parts.port}" if parts.port else "")
    return redact(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))
