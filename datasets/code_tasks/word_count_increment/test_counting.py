import unittest

from counting import word_counts


class WordCountTest(unittest.TestCase):
    def test_repeats(self):
        self.assertEqual(word_counts("a b a c a"), {"a": 3, "b": 1, "c": 1})


if __name__ == "__main__":
    unittest.main()
