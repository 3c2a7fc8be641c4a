"""Keeping values in range."""


def clamp(value, low, high):
    """value limited to the interval [low, high]."""
    return min(low, max(value, high))
