import unittest

from nesting import flatten


class FlattenTest(unittest.TestCase):
    def test_one_level(self):
        self.assertEqual(flatten([1, [2, 3], 4]), [1, 2, 3, 4])

    def test_deep(self):
        self.assertEqual(flatten([1, [2, [3, [4]]], []]), [1, 2, 3, 4])


if __name__ == "__main__":
    unittest.main()
