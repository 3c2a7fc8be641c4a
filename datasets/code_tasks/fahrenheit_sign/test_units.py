import unittest

from units import to_fahrenheit


class FahrenheitTest(unittest.TestCase):
    def test_points(self):
        self.assertEqual(to_fahrenheit(0), 32)
        self.assertEqual(to_fahrenheit(100), 212)
        self.assertEqual(to_fahrenheit(-40), -40)


if __name__ == "__main__":
    unittest.main()
