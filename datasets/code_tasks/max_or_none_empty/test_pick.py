import unittest

from pick import largest


class LargestTest(unittest.TestCase):
    def test_values(self):
        self.assertEqual(largest([3, 9, 2]), 9)

    def test_empty(self):
        self.assertIsNone(largest([]))


if __name__ == "__main__":
    unittest.main()
