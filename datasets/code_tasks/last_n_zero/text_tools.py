"""String helpers."""


def last_n(text, n):
    """The last n characters of text ('' when n is 0)."""
    return text[-n:]
