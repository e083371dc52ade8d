"""The Kubernetes CEL libraries that DRA selectors use, for cel-python (see `kube.cel`).

Quantities (`quantity`, `isQuantity` and their methods), semantic versions (`semver`,
`isSemver` and their methods), the strings extension, regexes and list helpers, with
Kubernetes semantics; `FUNCTIONS` maps each name to its implementation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import total_ordering
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

# --------------------------------------------------------------------------- Quantity

_INT64_MAX = 2**63 - 1
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes resource quantity (`20Gi`, `1.5G`, `100m`, `1e3`)."""
    m = _QUANTITY_RE.match(text)
    if m is None:
        raise ValueError(f"invalid quantity {text!r}")
    num = Fraction(m["num"])
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        return num * _BINARY[suffix]
    if suffix in _DECIMAL:
        return num * _DECIMAL[suffix]
    return num * Fraction(10) ** int(suffix[1:])


@dataclass(frozen=True, slots=True, eq=False)
class Quantity:
    """A Kubernetes resource.Quantity as CEL sees it (exact arithmetic, semantic equality)."""

    value: Fraction
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> Quantity:
        return cls(parse_quantity(text), text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text or str(self.value)!r})"


def _q_operand(x: Any) -> Fraction:
    if isinstance(x, Quantity):
        return x.value
    if isinstance(x, int) and not isinstance(x, bool):
        return Fraction(int(x))
    raise TypeError(f"expected a quantity or an int, got {type(x).__name__}")


def _q_add(a: Quantity, b: Any) -> Quantity:
    return Quantity(a.value + _q_operand(b))


def _q_sub(a: Quantity, b: Any) -> Quantity:
    return Quantity(a.value - _q_operand(b))


def _q_as_integer(a: Quantity) -> Any:
    if a.value.denominator != 1 or abs(a.value) > _INT64_MAX:
        return CELEvalError(f"{a!r} cannot be represented as an int64")
    return celtypes.IntType(int(a.value))


def _q_as_float(a: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(a.value))


def _q_is_integer(a: Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(a.value.denominator == 1 and abs(a.value) <= _INT64_MAX)


def _q_sign(a: Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > 0) - (a.value < 0))


# --------------------------------------------------------------------------- Semver

_SEMVER_RE = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


@total_ordering
@dataclass(frozen=True, slots=True)
class Semver:
    """A semantic version (DRA `version` attributes, `semver()`); ordered per semver.org."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Semver:
        m = _SEMVER_RE.match(text)
        if m is None:
            raise ValueError(f"invalid semver {text!r}")
        pre = tuple(m[4].split(".")) if m[4] else ()
        return cls(int(m[1]), int(m[2]), int(m[3]), pre)

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # A release sorts after its pre-releases; numeric identifiers before alphanumeric ones.
        ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, ids)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._key() < other._key()


# --------------------------------------------------------------------------- shared methods


def _parsing(parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    """`quantity()`, `semver()`: the text parsed, or a CEL error where it does not parse."""

    def parsed(text: Any) -> Any:
        try:
            return parse(str(text))
        except ValueError as ex:
            return CELEvalError(str(ex))

    return parsed


def _matching(pattern: re.Pattern[str]) -> Callable[[Any], celtypes.BoolType]:
    """`isQuantity()`, `isSemver()`: whether the text parses."""

    def matches(text: Any) -> celtypes.BoolType:
        return celtypes.BoolType(pattern.match(str(text)) is not None)

    return matches


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, Quantity):
        x, y = a.value, _q_operand(b)
        return (x > y) - (x < y)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return (a > b) - (a < b)
    raise TypeError(f"compareTo is not defined on {type(a).__name__}, {type(b).__name__}")


def _compare_to(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType(_cmp(a, b))


def _is_greater_than(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_cmp(a, b) > 0)


def _is_less_than(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_cmp(a, b) < 0)


def _semver_part(index: int) -> Callable[[Semver], celtypes.IntType]:
    def part(v: Semver) -> celtypes.IntType:
        if not isinstance(v, Semver):
            raise TypeError("expected a semver")
        return celtypes.IntType((v.major, v.minor, v.patch)[index])

    return part


# --------------------------------------------------------------------------- strings and lists


def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, got {type(x).__name__}")
    return x


def _char_at(s: Any, i: Any) -> Any:
    text, idx = _str(s), int(i)
    if not 0 <= idx <= len(text):
        return CELEvalError(f"index out of range: {idx}")
    return celtypes.StringType(text[idx : idx + 1])


def _index_of(s: Any, sub: Any, start: Any = 0) -> Any:
    if isinstance(s, list):
        return celtypes.IntType(next((i for i, x in enumerate(s) if x == sub), -1))
    text, offset = _str(s), int(start)
    if not 0 <= offset <= len(text):
        return CELEvalError(f"index out of range: {offset}")
    return celtypes.IntType(text.find(_str(sub), offset))


def _last_index_of(s: Any, sub: Any, end: Any = None) -> Any:
    if isinstance(s, list):
        found = [i for i, x in enumerate(s) if x == sub]
        return celtypes.IntType(found[-1] if found else -1)
    text = _str(s)
    limit = len(text) if end is None else int(end)
    if not 0 <= limit <= len(text):
        return CELEvalError(f"index out of range: {limit}")
    return celtypes.IntType(text.rfind(_str(sub), 0, limit + len(_str(sub))))


def _ascii_case(upper: bool) -> Callable[[Any], celtypes.StringType]:
    def convert(s: Any) -> celtypes.StringType:
        text = _str(s)
        table = str.maketrans(
            *(
                ("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                if upper
                else ("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
            )
        )
        return celtypes.StringType(text.translate(table))

    return convert


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> celtypes.StringType:
    return celtypes.StringType(_str(s).replace(_str(old), _str(new), int(n)))


def _split(s: Any, sep: Any, n: Any = -1) -> celtypes.ListType:
    limit = int(n)
    if limit == 0:
        return celtypes.ListType([])
    parts = _str(s).split(_str(sep), limit - 1 if limit > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _substring(s: Any, start: Any, end: Any = None) -> Any:
    text = _str(s)
    a, b = int(start), len(text) if end is None else int(end)
    if not 0 <= a <= b <= len(text):
        return CELEvalError(f"substring out of range: [{a}:{b}]")
    return celtypes.StringType(text[a:b])


def _trim(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_str(s).strip())


def _join(items: Any, sep: Any = "") -> celtypes.StringType:
    return celtypes.StringType(_str(sep).join(_str(x) for x in items))


def _find(s: Any, pattern: Any) -> celtypes.StringType:
    m = re.search(_str(pattern), _str(s))
    return celtypes.StringType(m.group(0) if m else "")


def _find_all(s: Any, pattern: Any, n: Any = -1) -> celtypes.ListType:
    found = [celtypes.StringType(m.group(0)) for m in re.finditer(_str(pattern), _str(s))]
    limit = int(n)
    return celtypes.ListType(found if limit < 0 else found[:limit])


def _is_sorted(items: Any) -> celtypes.BoolType:
    values = list(items)
    return celtypes.BoolType(all(values[i] <= values[i + 1] for i in range(len(values) - 1)))


def _sum(items: Any) -> Any:
    values = list(items)
    if values and isinstance(values[0], Quantity):
        return Quantity(sum((_q_operand(v) for v in values), Fraction(0)))
    total = values[0] if values else celtypes.IntType(0)
    for v in values[1:]:
        total = total + v
    return total


def _dyn(x: Any) -> Any:
    return x


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _parsing(Quantity.parse),
    "isQuantity": _matching(_QUANTITY_RE),
    "add": _q_add,
    "sub": _q_sub,
    "asInteger": _q_as_integer,
    "asApproximateFloat": _q_as_float,
    "isInteger": _q_is_integer,
    "sign": _q_sign,
    "semver": _parsing(Semver.parse),
    "isSemver": _matching(_SEMVER_RE),
    "major": _semver_part(0),
    "minor": _semver_part(1),
    "patch": _semver_part(2),
    "compareTo": _compare_to,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": _ascii_case(upper=False),
    "upperAscii": _ascii_case(upper=True),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": _trim,
    "join": _join,
    "find": _find,
    "findAll": _find_all,
    "isSorted": _is_sorted,
    "sum": _sum,
    "dyn": _dyn,
}
