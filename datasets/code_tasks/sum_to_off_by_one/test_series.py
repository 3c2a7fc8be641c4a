import unittest

from series import sum_to


class SumToTest(unittest.TestCase):
    def test_small(self):
        self.assertEqual(sum_to(1), 1)
        self.assertEqual(sum_to(4), 10)

    def test_zero(self):
        self.assertEqual(sum_to(0), 0)


if __name__ == "__main__":
    unittest.main()
