"""Picking items from lists."""


def largest(items):
    """The largest item, or None when the list is empty."""
    best = items[0]
    for item in items[1:]:
        if item > best:
            best = item
    return best
