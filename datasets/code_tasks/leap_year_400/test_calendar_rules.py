import unittest

from calendar_rules import is_leap


class LeapTest(unittest.TestCase):
    def test_rules(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))
        self.assertFalse(is_leap(1900))
        self.assertTrue(is_leap(2000))


if __name__ == "__main__":
    unittest.main()
