import unittest

from search import find


class FindTest(unittest.TestCase):
    def test_every_item(self):
        items = [1, 3, 5, 7, 9, 11]
        for index, value in enumerate(items):
            self.assertEqual(find(items, value), index)

    def test_missing(self):
        self.assertEqual(find([1, 3, 5], 4), -1)


if __name__ == "__main__":
    unittest.main()
