import unittest

from tags import add_tag


class AddTagTest(unittest.TestCase):
    def test_fresh_lists(self):
        self.assertEqual(add_tag("a"), ["a"])
        self.assertEqual(add_tag("b"), ["b"])

    def test_given_list(self):
        self.assertEqual(add_tag("c", ["x"]), ["x", "c"])


if __name__ == "__main__":
    unittest.main()
