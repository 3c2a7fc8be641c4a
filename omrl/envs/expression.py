"""A safe arithmetic evaluator (ast walk, no eval) and tolerant number parsing for answer matching."""

from __future__ import annotations

import ast
import math
import operator
import re

MAX_LENGTH = 500          # characters of one expression
MAX_EXPONENT = 1000       # |b| in a ** b
MAX_BITS = 4096           # size of integer intermediates, so 9**9**9 cannot eat the machine

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class ExpressionError(ValueError):
    """The expression is not plain arithmetic, or evaluating it failed (division by zero, too large)."""


def evaluate(expression: str) -> int | float:
    """Evaluate numbers, + - * / // % **, parentheses and unary minus; raise ExpressionError otherwise."""
    text = normalize_expression(expression)
    if not text:
        raise ExpressionError("empty expression")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ExpressionError(f"not a valid arithmetic expression: {expression!r}") from None
    return _eval(tree.body)


def normalize_expression(expression: str) -> str:
    """Accept what people write: 1,000 thousands separators, x/× for times, ÷, ^ for power, $ and %."""
    text = str(expression).strip()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = text.replace("×", "*").replace("÷", "/").replace("^", "**").replace("$", "")
    text = re.sub(r"(?<=\d)\s*[xX]\s*(?=[\d(])", "*", text)
    return text


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ExpressionError("number too large")  # 1e309 parses as inf
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT:
                raise ExpressionError(f"exponent {right} is larger than {MAX_EXPONENT}")
            if isinstance(left, int) and isinstance(right, int) and right > 0 \
                    and abs(left).bit_length() * right > MAX_BITS:
                raise ExpressionError("result too large")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ExpressionError("division by zero") from None
        except OverflowError:
            raise ExpressionError("result too large") from None
        if isinstance(result, complex):
            raise ExpressionError("result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_BITS:
            raise ExpressionError("result too large")
        if isinstance(result, float) and not math.isfinite(result):
            raise ExpressionError("result is not finite")
        return result
    raise ExpressionError(f"not allowed in an arithmetic expression: {ast.unparse(node)!r}")


def format_number(value: int | float) -> str:
    """12.0 -> '12', 0.1+0.2 -> '0.3': what a calculator shows."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+")


def parse_number(text: object) -> float | None:
    """The number a free-form answer states ('$1,000', '5.0', '3/4', 'x = 7 apples'): its last number, or None."""
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    cleaned = re.sub(r"(?<=\d),(?=\d)", "", str(text)).replace("$", "").replace("−", "-")
    found = _NUMBER.findall(cleaned)
    if not found:
        return None
    last = found[-1]
    if "/" in last:
        numerator, denominator = last.split("/")
        return float(numerator) / float(denominator) if float(denominator) else None
    return float(last)


def numbers_match(answer: object, gold: object, rel_tol: float = 1e-6) -> bool:
    """True when both state the same number (within a relative tolerance)."""
    a, g = parse_number(answer), parse_number(gold)
    if a is None or g is None:
        return False
    return math.isclose(a, g, rel_tol=rel_tol, abs_tol=1e-9)
