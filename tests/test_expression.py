"""Subscription expressions: parsing, typing, three-valued evaluation."""

from __future__ import annotations

import random
import re

import pytest

from protocol.expression import ExpressionError, compile_expression


@pytest.mark.parametrize("text, props, expected", [
    ("region = 'EU'", {"region": "EU"}, True),
    ('region == "EU"', {"region": "US"}, False),
    ("region = 'EU'", {}, False),                       # missing: unknown, so no match
    ("region = 'EU'", {"region": 5}, False),            # wrong type: unknown
    ("amount > 10 && region != 'EU'", {"amount": 11, "region": "US"}, True),
    ("amount > 10 and region != 'EU'", {"amount": 10, "region": "US"}, False),
    ("!(amount > 10) || flag", {"amount": 20, "flag": True}, True),
    ("not flag", {"flag": False}, True),
    ("exists(region)", {"region": "x"}, True),
    ("exists(region) && region = 'EU'", {}, False),
    ("!exists(region) || region = 'EU'", {}, True),
    ("missing > 1 || ok", {"ok": True}, True),          # unknown || true is true
    ("missing > 1 && ok", {"ok": True}, False),         # unknown && true is unknown
    ("!(missing > 1)", {}, False),                      # not unknown is unknown
    ("a + b * 2 = 7", {"a": 1, "b": 3}, True),
    ("a / b = -2", {"a": -7, "b": 3}, True),            # truncates toward zero as in C
    ("a % b = -1", {"a": -7, "b": 3}, True),
    ("a / b = 0 || true", {"a": 1, "b": 0}, True),
    ("a / b = 0", {"a": 1, "b": 0}, False),             # division by zero is unknown
    ("a * 2 > 0", {"a": 2**62}, False),                 # overflow is unknown
    ("-a = -3", {"a": 3}, True),
    ("name < 'm'", {"name": "alpha"}, True),
    ("big = 9223372036854775807", {"big": 2**63 - 1}, True),
])
def test_evaluation(text, props, expected):
    assert compile_expression(text).matches(props) is expected


@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    ("x" * 129, "at most 128"),
    ("region = ", "unexpected"),
    ("region = 'EU' &&", "unexpected"),
    ("a = b", "cannot tell the type"),
    ("a = 1 && a = 'x'", "used both as integer and as string"),
    ("a + 'x' > 1", "where a integer is needed"),
    ("region", "") ,                                    # a bare name is a boolean property: valid
    ("a $ b", "unexpected character"),
    ("(a = 1", "expected ')'"),
    ("flag < true", "not booleans"),
    ("99999999999999999999 = a", "does not fit"),
    ("5", "where a boolean is needed"),
])
def test_errors_say_why(text, reason):
    if not reason:
        compile_expression(text)
        return
    with pytest.raises(ExpressionError, match=re.escape(reason)):
        compile_expression(text)


def test_property_types_are_inferred_from_use():
    assert compile_expression("region = 'EU' && n > 3 && vip").types == {
        "region": "string", "n": "integer", "vip": "boolean"}


EXPRESSIONS = [
    "region = 'EU'", "amount > 10 && region != 'EU'", "!(amount > 10) || flag", "exists(region)",
    "missing > 1 || flag", "missing > 1 && flag", "a / b = -2", "a % b = -1", "a / b = 0 || flag",
    "a * b > 0", "-a < b", "name < 'm' || !flag", "a - b >= 0 && exists(name)", "it's = 'x'".replace("it's", "q"),
    "name = 'o\\'brien'",
]


def random_properties(rng: random.Random) -> dict:
    props: dict = {}
    for name, kinds in (("region", ["EU", "US", 3]), ("amount", [5, 10, 11, "x"]), ("flag", [True, False, 1]),
                        ("a", [-7, 7, 0, 2**62, -(2**63)]), ("b", [3, -3, 0, -1, 2]),
                        ("name", ["alpha", "zulu", "o'brien", b"bin"]), ("q", ["x", "y"])):
        if rng.random() < 0.8:
            props[name] = rng.choice(kinds)
    return props


@pytest.mark.spark
def test_spark_sql_agrees_with_python_on_random_properties(spark):
    """The pipeline (Spark SQL) and the primary (Python) must route alike."""
    from pyspark.sql import functions as F

    from protocol.properties import to_wire, wire_to_maps

    rng = random.Random(7)
    cases = [random_properties(rng) for _ in range(300)]
    rows = []
    for i, props in enumerate(cases):
        values, types = wire_to_maps(to_wire(props))
        rows.append((i, dict(values), dict(types)))
    df = spark.createDataFrame(rows, "i int, properties map<string,string>, property_types map<string,string>")
    for text in EXPRESSIONS:
        expression = compile_expression(text)
        got = {r.i: r.m for r in df.select("i", F.expr(expression.to_spark_sql()).alias("m")).collect()}
        for i, props in enumerate(cases):
            assert (got[i] is True) == expression.matches(props), (text, props, got[i])
