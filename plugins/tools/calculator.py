"""A calculator tool: arithmetic expressions evaluated from their syntax tree (never `eval`)."""

from __future__ import annotations

import ast
import operator
from typing import Any

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64  # 9**9**9 would take the process down: keep powers small
MAX_MAGNITUDE = 10**60
MAX_LENGTH = 200


class CalculatorError(ValueError):
    """An expression the calculator does not accept."""


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise CalculatorError("result out of range")
        return value
    raise CalculatorError(f"unsupported syntax: {ast.dump(node)[:60]}")


def evaluate(expression: str) -> int | float:
    """The value of an expression of numbers, + - * / // % ** and parentheses."""
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None


async def calculator(arguments: dict[str, Any]) -> str:
    """Tool entry point: {"expression": "3 * (4 + 5)"} -> "27"."""
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        raise CalculatorError('calculator needs {"expression": "<arithmetic>"}')
    value = evaluate(expression)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
