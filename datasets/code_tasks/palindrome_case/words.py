"""Word puzzles."""


def is_palindrome(text):
    """True when text reads the same backwards, ignoring case, spaces and punctuation."""
    letters = [c for c in text]
    return letters == letters[::-1]
