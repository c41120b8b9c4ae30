"""The calculator tool: arithmetic only, evaluated from the parsed expression tree.

Never `eval`: an agent's tool call is untrusted text. Allowed are integer and decimal
literals, + - * / // % and ** (small exponents), unary minus and parentheses. Anything else
(names, calls, attributes, strings, huge powers, literals that overflow a float such as 1e999)
raises CalculatorError, which the agent sees as a failed tool call (and the AIR deriver as a
malformed one); no other exception leaves `evaluate`.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from examples.errors import ExamplesError

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 12
MAX_MAGNITUDE = 10**18

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ExamplesError):
    """The expression is not plain arithmetic, or cannot be evaluated."""


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression ('17*(3+4)' -> 119)."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise CalculatorError("empty expression; expected arithmetic such as 12*(3+4)")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression of {len(text)} characters; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"{expression!r} is not an arithmetic expression ({exc.msg})") from exc
    try:
        return _eval(tree.body, expression)
    except CalculatorError:
        raise
    # The checks below should leave none of these; if one gets through, it is still a failed
    # tool call for the agent, not a crash of its episode.
    except (ArithmeticError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"{expression!r} cannot be evaluated: {exc}") from exc


def _eval(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        # 1e999 parses as float infinity: no number the tool can work with.
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError(f"a number in {source!r} overflows: expected numbers of at "
                                  f"most {MAX_MAGNITUDE:.0e} in magnitude")
        value = Fraction(str(node.value))
        if abs(value) > MAX_MAGNITUDE:
            raise CalculatorError(f"{source!r} exceeds {MAX_MAGNITUDE:.0e} in magnitude")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, source))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, source), _eval(node.right, source)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponent {right} in {source!r}: expected a whole number "
                                      f"of at most {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError(f"zero to a negative power in {source!r}")
            value = left ** int(right)
        elif isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError(f"division by zero in {source!r}")
        else:
            value = _BINARY[type(node.op)](left, right)
            value = Fraction(value)
        if abs(value) > MAX_MAGNITUDE:
            raise CalculatorError(f"{source!r} exceeds {MAX_MAGNITUDE:.0e} in magnitude")
        return value
    shown = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    raise CalculatorError(
        f"{shown!r} in {source!r} is not allowed: only numbers, + - * / // % **, and parentheses"
    )


def format_number(value: Fraction) -> str:
    """'119' for whole numbers, else a decimal rounded to 6 places ('2.5')."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")
