"""Gregorian calendar rules."""


def is_leap(year):
    """Leap years are divisible by 4, except centuries, except centuries divisible by 400."""
    return year % 4 == 0 and year % 100 != 0
