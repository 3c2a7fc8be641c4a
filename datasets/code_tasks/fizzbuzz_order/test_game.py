import unittest

from game import fizzbuzz


class FizzBuzzTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(fizzbuzz(9), "Fizz")
        self.assertEqual(fizzbuzz(10), "Buzz")
        self.assertEqual(fizzbuzz(30), "FizzBuzz")
        self.assertEqual(fizzbuzz(7), "7")


if __name__ == "__main__":
    unittest.main()
