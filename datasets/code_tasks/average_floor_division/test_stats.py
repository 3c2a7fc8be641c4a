import unittest

from stats import average


class AverageTest(unittest.TestCase):
    def test_exact_mean(self):
        self.assertEqual(average([1, 2]), 1.5)
        self.assertEqual(average([2, 4, 6]), 4)


if __name__ == "__main__":
    unittest.main()
