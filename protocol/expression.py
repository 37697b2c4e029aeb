"""Subscription expressions: BlazingMQ's filter language over message properties.

One parser, two back ends that agree on every input:

- `Expression.matches(properties)` evaluates in Python (the primary uses it for
  consumer subscriptions at dispatch time);
- `Expression.to_spark_sql()` renders a Spark SQL boolean expression over the
  tables' `properties` / `property_types` maps (the pipeline uses it for
  application subscriptions in fanout and priority domains).

The language (BlazingMQ's `E_VERSION_1` subset, at most 128 characters):

    literals     123  -5  "text"  'text'  true  false
    identifiers  property names: region, amount, is_test
    operators    ||  &&  !            (also: or, and, not)
                 =  ==  !=  <  <=  >  >=
                 +  -  *  /  %        (64-bit integers; / and % truncate as in C)
    functions    exists(name)         true when the message has that property

Typing: each property name takes its type from where it is used (`region = 'EU'`
makes `region` a string; `amount > 10` an integer; `is_test && ...` a boolean).
A name used with two types, or a comparison of two names, is rejected when the
expression is compiled: there is nothing to tell the type from.

Evaluation uses SQL's three-valued logic in both back ends. A property that is
missing, or whose type differs from the one the expression needs, is unknown;
so is division by zero and integer overflow. Unknown propagates through
comparisons and arithmetic; `false && unknown` is false and `true || unknown` is
true. A message matches only when the whole expression is true.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Union

MAX_LENGTH = 128
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

INT, STRING, BOOL = "integer", "string", "boolean"

Value = Union[int, str, bool, None]


class ExpressionError(ValueError):
    """The expression is not valid; the message says where and why."""


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<int>\d+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|[=<>!+\-*/%()])
""", re.VERBOSE)

_WORD_OPS = {"or": "||", "and": "&&", "not": "!"}


@dataclass(frozen=True)
class _Tok:
    kind: str   # int, str, name, op, end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionError(f"unexpected character {text[pos]!r} at position {pos}")
        kind = m.lastgroup or ""
        if kind != "ws":
            value = m.group()
            if kind == "name" and value.lower() in _WORD_OPS:
                kind, value = "op", _WORD_OPS[value.lower()]
            tokens.append(_Tok(kind, value, pos))
        pos = m.end()
    tokens.append(_Tok("end", "", len(text)))
    return tokens


# AST: tuples. ("lit", value) ("prop", name) ("exists", name) ("not", x)
# ("neg", x) ("bin", op, left, right)
Node = tuple[Any, ...]

_BINARY_LEVELS: list[tuple[str, ...]] = [
    ("||",), ("&&",), ("=", "==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%"),
]


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> _Tok:
        return self.tokens[self.i]

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text or tok.kind not in ("op",):
            raise ExpressionError(f"expected {text!r} at position {tok.pos}, got {tok.text or 'end of input'!r}")

    def parse(self) -> Node:
        node = self.binary(0)
        tok = self.peek()
        if tok.kind != "end":
            raise ExpressionError(f"unexpected {tok.text!r} at position {tok.pos}")
        return node

    def binary(self, level: int) -> Node:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while self.peek().kind == "op" and self.peek().text in _BINARY_LEVELS[level]:
            op = self.take().text
            op = "=" if op == "==" else op
            node = ("bin", op, node, self.binary(level + 1))
        return node

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text == "!":
            self.take()
            return ("not", self.unary())
        if tok.kind == "op" and tok.text == "-":
            self.take()
            inner = self.unary()
            if inner[0] == "lit" and isinstance(inner[1], int) and not isinstance(inner[1], bool):
                return ("lit", _check_int(-inner[1], tok.pos))
            return ("neg", inner)
        return self.primary()

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "int":
            return ("lit", _check_int(int(tok.text), tok.pos))
        if tok.kind == "str":
            return ("lit", re.sub(r"\\(.)", r"\1", tok.text[1:-1]))
        if tok.kind == "name":
            lowered = tok.text.lower()
            if lowered in ("true", "false"):
                return ("lit", lowered == "true")
            if lowered == "exists" and self.peek().text == "(":
                self.take()
                name = self.take()
                if name.kind != "name":
                    raise ExpressionError(f"exists() takes a property name, got {name.text!r} at position {name.pos}")
                self.expect(")")
                return ("exists", name.text)
            return ("prop", tok.text)
        if tok.kind == "op" and tok.text == "(":
            node = self.binary(0)
            self.expect(")")
            return node
        raise ExpressionError(f"unexpected {tok.text or 'end of input'!r} at position {tok.pos}")


def _check_int(value: int, pos: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ExpressionError(f"integer literal at position {pos} does not fit in 64 bits")
    return value


def _literal_type(value: Value) -> str:
    if isinstance(value, bool):
        return BOOL
    return INT if isinstance(value, int) else STRING


class _Typer:
    """Assigns each property name one type from its use, and checks operators."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}

    def bind(self, name: str, type_: str) -> str:
        known = self.types.setdefault(name, type_)
        if known != type_:
            raise ExpressionError(f"property {name!r} is used both as {known} and as {type_}")
        return type_

    def infer(self, node: Node) -> str | None:
        """The node's type when it can be told without context, else None (a bare name)."""
        kind = node[0]
        if kind == "lit":
            return _literal_type(node[1])
        if kind == "prop":
            return self.types.get(node[1])
        if kind in ("exists", "not"):
            return BOOL
        if kind == "neg":
            return INT
        op = node[1]
        if op in ("||", "&&", "=", "!=", "<", "<=", ">", ">="):
            return BOOL
        return INT

    def check(self, node: Node, expected: str) -> None:
        kind = node[0]
        if kind == "lit":
            actual = _literal_type(node[1])
            if actual != expected:
                raise ExpressionError(f"{node[1]!r} is a {actual} where a {expected} is needed")
        elif kind == "prop":
            self.bind(node[1], expected)
        elif kind == "exists":
            self._need(BOOL, expected, "exists()")
        elif kind == "not":
            self._need(BOOL, expected, "!")
            self.check(node[1], BOOL)
        elif kind == "neg":
            self._need(INT, expected, "unary -")
            self.check(node[1], INT)
        else:
            _, op, left, right = node
            if op in ("||", "&&"):
                self._need(BOOL, expected, op)
                self.check(left, BOOL)
                self.check(right, BOOL)
            elif op in ("+", "-", "*", "/", "%"):
                self._need(INT, expected, op)
                self.check(left, INT)
                self.check(right, INT)
            else:
                self._need(BOOL, expected, op)
                lt, rt = self.infer(left), self.infer(right)
                if lt and rt and lt != rt:
                    for node_, other in ((left, rt), (right, lt)):
                        if node_[0] == "prop":
                            used = lt if node_ is left else rt
                            raise ExpressionError(f"property {node_[1]!r} is used both as {used} and as {other}")
                    raise ExpressionError(f"{op} compares a {lt} with a {rt}")
                side = lt or rt
                if side is None:
                    raise ExpressionError(f"cannot tell the type of {_show(left)} {op} {_show(right)}: "
                                          "compare a property with a literal or an expression")
                if op in ("<", "<=", ">", ">=") and side == BOOL:
                    raise ExpressionError(f"{op} compares integers or strings, not booleans")
                self.check(left, side)
                self.check(right, side)

    @staticmethod
    def _need(actual: str, expected: str, what: str) -> None:
        if actual != expected:
            raise ExpressionError(f"{what} gives a {actual} where a {expected} is needed")


def _show(node: Node) -> str:
    return node[1] if node[0] == "prop" else "(expression)"


@dataclass(frozen=True)
class Expression:
    text: str
    tree: Node
    types: Mapping[str, str]   # property name -> integer | string | boolean

    # -- Python back end ----------------------------------------------------
    def matches(self, properties: Mapping[str, object]) -> bool:
        return _eval(self.tree, properties, self.types) is True

    # -- Spark SQL back end -------------------------------------------------
    def to_spark_sql(self, properties: str = "properties", types: str = "property_types") -> str:
        """A Spark SQL boolean expression (true / false / NULL) over the two maps."""
        return _sql(self.tree, self.types, properties, types)


def compile_expression(text: str) -> Expression:
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression is {len(text)} characters; at most {MAX_LENGTH}")
    tree = _Parser(text).parse()
    typer = _Typer()
    typer.check(tree, BOOL)
    return Expression(text, tree, dict(typer.types))


def _property(name: str, properties: Mapping[str, object], type_: str) -> Value:
    value = properties.get(name)
    if type_ == BOOL:
        return value if isinstance(value, bool) else None
    if type_ == INT:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return value if isinstance(value, str) else None


def _int(value: int) -> int | None:
    return value if INT64_MIN <= value <= INT64_MAX else None


def _eval(node: Node, props: Mapping[str, object], types: Mapping[str, str]) -> Value:
    kind = node[0]
    if kind == "lit":
        value: Value = node[1]
        return value
    if kind == "prop":
        return _property(node[1], props, types[node[1]])
    if kind == "exists":
        return node[1] in props
    if kind == "not":
        inner = _eval(node[1], props, types)
        return None if inner is None else not inner
    if kind == "neg":
        inner = _eval(node[1], props, types)
        return None if inner is None else _int(-inner)  # type: ignore[operator]
    _, op, left_node, right_node = node
    if op in ("&&", "||"):
        left = _eval(left_node, props, types)
        if op == "&&" and left is False or op == "||" and left is True:
            return left
        right = _eval(right_node, props, types)
        if op == "&&":
            return False if right is False else (None if None in (left, right) else True)
        return True if right is True else (None if None in (left, right) else False)
    left, right = _eval(left_node, props, types), _eval(right_node, props, types)
    if left is None or right is None:
        return None
    if op == "=":
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right  # type: ignore[operator]
    if op == "<=":
        return left <= right  # type: ignore[operator]
    if op == ">":
        return left > right  # type: ignore[operator]
    if op == ">=":
        return left >= right  # type: ignore[operator]
    a, b = int(left), int(right)
    if op == "+":
        return _int(a + b)
    if op == "-":
        return _int(a - b)
    if op == "*":
        return _int(a * b)
    if b == 0:
        return None
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C: truncate toward zero
    return _int(quotient) if op == "/" else a - b * quotient


def sql_string(value: str) -> str:
    """A Spark SQL string literal for `value` (backslashes and quotes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql(node: Node, types: Mapping[str, str], props: str, ptypes: str) -> str:
    kind = node[0]
    if kind == "lit":
        value = node[1]
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, int):
            return f"CAST({value} AS BIGINT)" if value >= 0 else f"CAST('{value}' AS BIGINT)"
        return sql_string(value)
    if kind == "prop":
        name = sql_string(node[1])
        type_ = types[node[1]]
        if type_ == INT:
            return (f"(CASE WHEN {ptypes}[{name}] IN ('int32', 'int64') "
                    f"THEN CAST({props}[{name}] AS BIGINT) END)")
        if type_ == BOOL:
            return f"(CASE WHEN {ptypes}[{name}] = 'bool' THEN {props}[{name}] = 'true' END)"
        return f"(CASE WHEN {ptypes}[{name}] = 'string' THEN {props}[{name}] END)"
    if kind == "exists":
        return f"coalesce(map_contains_key({props}, {sql_string(node[1])}), FALSE)"
    if kind == "not":
        return f"(NOT {_sql(node[1], types, props, ptypes)})"
    if kind == "neg":
        return f"try_subtract(CAST(0 AS BIGINT), {_sql(node[1], types, props, ptypes)})"
    _, op, left_node, right_node = node
    left, right = _sql(left_node, types, props, ptypes), _sql(right_node, types, props, ptypes)
    if op in ("&&", "||"):
        return f"({left} {'AND' if op == '&&' else 'OR'} {right})"
    if op in ("=", "!=", "<", "<=", ">", ">="):
        return f"({left} {'<>' if op == '!=' else op} {right})"
    if op in ("+", "-", "*"):
        fn = {"+": "try_add", "-": "try_subtract", "*": "try_multiply"}[op]
        return f"{fn}({left}, {right})"
    # Integer division and remainder truncate toward zero (Java's long ops, as in C).
    # Division by zero is unknown; MIN / -1 overflows, which is unknown as in Python.
    sql_op = "DIV" if op == "/" else "%"
    return (f"(CASE WHEN {right} = 0 THEN NULL "
            f"WHEN {left} = CAST('{INT64_MIN}' AS BIGINT) AND {right} = CAST(-1 AS BIGINT) "
            f"THEN {'NULL' if op == '/' else 'CAST(0 AS BIGINT)'} "
            f"ELSE {left} {sql_op} {right} END)")
