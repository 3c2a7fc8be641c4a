import unittest

from text_tools import last_n


class LastNTest(unittest.TestCase):
    def test_some(self):
        self.assertEqual(last_n("hello", 3), "llo")

    def test_zero(self):
        self.assertEqual(last_n("hello", 0), "")


if __name__ == "__main__":
    unittest.main()
