"""DRA device selectors evaluated with a real CEL implementation (cel-python).

The operator must know which MIG profiles would satisfy a pending ResourceClaim before any
device of that profile exists: it evaluates the DeviceClass and request selectors against a
*virtual* device of each profile, built exactly like the device the ResourceSlice will publish
(`slice_device` is that one definition; the slice publisher uses it too, so that the two never
disagree).

cel-python implements the CEL language and its standard functions; Kubernetes adds libraries
that DRA selectors use in practice. Implemented here with Kubernetes semantics:

- `quantity(s)`, `isQuantity(s)` and the Quantity methods `compareTo`, `isGreaterThan`,
  `isLessThan`, `add`, `sub`, `asInteger`, `asApproximateFloat`, `isInteger`, `sign`; `==` is
  semantic (`quantity("1Gi") == quantity("1024Mi")`). `<`/`>` are not defined on quantities in
  Kubernetes either.
- `semver(s)`, `isSemver(s)` and `compareTo`, `isGreaterThan`, `isLessThan`, `major`, `minor`,
  `patch` (DRA `version` attributes are semvers).
- strings extension: `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`,
  `split`, `substring`, `trim`, `join`; regex `find`, `findAll`; lists `isSorted`, `sum`,
  `indexOf`, `lastIndexOf`; `dyn`. Not provided: list `min`/`max` (cel-python reserves those
  names for its own macro), URL, IP/CIDR and format libraries.

DRA environment: `device.driver`, `device.attributes[domain].name`, `device.capacity[domain].name`
(a Quantity), `device.allowMultipleAllocations`. An unknown domain yields an empty map; an unknown
attribute is a runtime error (as in Kubernetes, where it aborts the allocation).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache, total_ordering
from typing import TYPE_CHECKING, Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, CELSyntaxError, CELUnsupportedError, base_functions

from migpart.dra import DRIVER
from migpart.errors import InvalidInput
from migpart.mig.profiles import device_name

if TYPE_CHECKING:
    from migpart.mig.profiles import ModelTable, Profile


class SelectorError(InvalidInput):
    """A CEL selector that does not compile, fails at run time, or yields no bool.

    DRA treats a runtime error as "this device does not match" and aborts the allocation; the
    operator reports it (an Event on the claim) instead of retrying.
    """

    def __init__(self, expression: str, message: str, *, runtime: bool = False) -> None:
        super().__init__("cel", f"{expression!r}: {message}")
        self.expression = expression
        self.reason = message
        self.runtime = runtime


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


def _quantity(text: Any) -> Any:
    try:
        return Quantity.parse(str(text))
    except ValueError as ex:
        return CELEvalError(str(ex))


def _is_quantity(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_QUANTITY_RE.match(str(text)) is not None)


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


def _semver(text: Any) -> Any:
    try:
        return Semver.parse(str(text))
    except ValueError as ex:
        return CELEvalError(str(ex))


def _is_semver(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_SEMVER_RE.match(str(text)) is not None)


# --------------------------------------------------------------------------- shared methods


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
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "add": _q_add,
    "sub": _q_sub,
    "asInteger": _q_as_integer,
    "asApproximateFloat": _q_as_float,
    "isInteger": _q_is_integer,
    "sign": _q_sign,
    "semver": _semver,
    "isSemver": _is_semver,
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
_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})
_KNOWN_FUNCTIONS = frozenset(base_functions) | frozenset(FUNCTIONS) | _MACROS
_BINDING_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_VARIABLES = frozenset({"device"})

_ENV = celpy.Environment()


# --------------------------------------------------------------------------- compile


def _names(tree: Any) -> tuple[set[str], set[str], set[str]]:
    """(called function names, bound macro variables, referenced identifiers) of a CEL AST."""
    calls: set[str] = set()
    bound: set[str] = set()
    idents: set[str] = set()
    for node in tree.iter_subtrees():
        tokens = [c for c in node.children if not hasattr(c, "data")]
        if node.data == "ident_arg" and tokens:
            calls.add(str(tokens[0]))
        elif node.data == "member_dot_arg" and tokens:
            name = str(tokens[0])
            calls.add(name)
            if name in _BINDING_MACROS and len(node.children) == 3:
                first = node.children[2].children[0]
                bound.update(
                    str(t) for t in first.scan_values(lambda v: getattr(v, "type", "") == "IDENT")
                )
        elif node.data == "ident" and tokens:
            idents.add(str(tokens[0]))
    return calls, bound, idents


@lru_cache(maxsize=4096)
def compile_selector(expression: str) -> celpy.Runner:
    """Parse, check and prepare `expression` once; later calls reuse the runner."""
    try:
        ast = _ENV.compile(expression)
    except (CELParseError, CELSyntaxError) as ex:
        column = getattr(ex, "column", None)
        where = f" at column {column}" if column else ""
        raise SelectorError(expression, f"syntax error{where}") from None
    calls, bound, idents = _names(ast)
    unknown = sorted(calls - _KNOWN_FUNCTIONS)
    if unknown:
        raise SelectorError(expression, f"undeclared function {', '.join(unknown)}")
    undeclared = sorted(idents - _VARIABLES - bound - {"true", "false", "null"})
    if undeclared:
        raise SelectorError(
            expression, f"undeclared reference {', '.join(undeclared)} (only device is defined)"
        )
    try:
        return _ENV.program(ast, functions=FUNCTIONS)
    except (CELSyntaxError, CELUnsupportedError) as ex:
        raise SelectorError(expression, f"unsupported: {ex}") from None


# --------------------------------------------------------------------------- devices

AttributeValue = str | int | bool | Semver


class _DomainMap(celtypes.MapType):
    """`device.attributes` / `device.capacity`: an unknown domain is an empty map (DRA)."""

    def __getitem__(self, key: Any) -> Any:
        if key not in self:
            return celtypes.MapType({})
        return super().__getitem__(key)


def _cel_value(value: AttributeValue | Quantity) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value


@dataclass(frozen=True, slots=True)
class Device:
    """A DRA device as a CEL selector sees it: domain -> name -> value."""

    driver: str
    attributes: Mapping[str, Mapping[str, AttributeValue]]
    capacity: Mapping[str, Mapping[str, Quantity]]
    allow_multiple_allocations: bool = False
    _cel: Any = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        def domains(m: Mapping[str, Mapping[str, Any]]) -> _DomainMap:
            return _DomainMap(
                {
                    celtypes.StringType(d): celtypes.MapType(
                        {celtypes.StringType(k): _cel_value(v) for k, v in attrs.items()}
                    )
                    for d, attrs in m.items()
                }
            )

        value = celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(self.driver),
                celtypes.StringType("attributes"): domains(self.attributes),
                celtypes.StringType("capacity"): domains(self.capacity),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                    self.allow_multiple_allocations
                ),
            }
        )
        object.__setattr__(self, "_cel", value)

    def attribute(self, qualified: str) -> AttributeValue | None:
        """The value of `domain/name` (or `name` in the driver's domain), None when absent."""
        domain, _, name = qualified.rpartition("/")
        return self.attributes.get(domain or self.driver, {}).get(name)


def _split_name(name: str, driver: str) -> tuple[str, str]:
    domain, _, short = name.rpartition("/")
    return domain or driver, short


def device_from_slice(driver: str, device: Mapping[str, Any]) -> Device:
    """A `Device` from one entry of a resource.k8s.io/v1 ResourceSlice `spec.devices`.

    Unqualified attribute and capacity names belong to the driver's domain, as in Kubernetes.
    """
    attributes: dict[str, dict[str, AttributeValue]] = {}
    for name, typed in (device.get("attributes") or {}).items():
        domain, short = _split_name(name, driver)
        value: AttributeValue
        if "string" in typed:
            value = str(typed["string"])
        elif "bool" in typed:
            value = bool(typed["bool"])
        elif "int" in typed:
            value = int(typed["int"])
        elif "version" in typed:
            value = Semver.parse(str(typed["version"]))
        else:
            raise InvalidInput(f"attributes.{name}", f"no value of a known type in {typed}")
        attributes.setdefault(domain, {})[short] = value
    capacity: dict[str, dict[str, Quantity]] = {}
    for name, cap in (device.get("capacity") or {}).items():
        domain, short = _split_name(name, driver)
        capacity.setdefault(domain, {})[short] = Quantity.parse(str(cap["value"]))
    return Device(
        driver=driver,
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=bool(device.get("allowMultipleAllocations", False)),
    )


def slice_device(
    gpu_index: int,
    profile: Profile,
    start: int,
    product_name: str,
    parent_uuid: str = "",
    uuid: str = "",
) -> dict[str, Any]:
    """The resource.k8s.io/v1 ResourceSlice device entry of one MIG instance.

    The one definition of what a migpart device publishes: the slice publisher
    (`migpart.kube.slices.instance_device`) builds its devices here, and `virtual_device`
    evaluates selectors against exactly this.
    """
    engines = {
        "copyEngines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpegs": profile.jpegs,
        "ofas": profile.ofas,
    }
    # Engines are published only where the profile has some; a selector on a missing one
    # errors, in the planner as in the scheduler.
    capacity = {
        "memory": {"value": str(profile.memory_mib * 1024 * 1024)},
        "multiprocessors": {"value": str(profile.multiprocessors)},
        "computeSlices": {"value": str(profile.compute_slices)},
        "memorySlices": {"value": str(profile.memory_slices)},
    }
    capacity.update({k: {"value": str(v)} for k, v in engines.items() if v > 0})
    return {
        "name": device_name(gpu_index, profile.name, start),
        "attributes": {
            "profile": {"string": profile.name},
            "productName": {"string": product_name},
            "parentUUID": {"string": parent_uuid},
            "uuid": {"string": uuid},
            "gpuIndex": {"int": gpu_index},
            "placementStart": {"int": start},
        },
        "capacity": capacity,
    }


def virtual_device(
    table: ModelTable,
    profile: str,
    gpu_index: int = 0,
    start: int | None = None,
    parent_uuid: str = "",
    uuid: str = "",
) -> Device:
    """The device a MIG instance of `profile` on a GPU of `table`'s model would publish.

    `start` defaults to the profile's first placement. UUIDs are unknown before the instance
    exists; a selector that tests them cannot be judged in advance (it sees "").
    """
    p = table.profile(profile)
    at = p.placements[0] if start is None and p.placements else (start or 0)
    return device_from_slice(
        DRIVER, slice_device(gpu_index, p, at, table.model, parent_uuid=parent_uuid, uuid=uuid)
    )


# --------------------------------------------------------------------------- evaluate


def _runtime_message(ex: CELEvalError) -> str:
    text = str(ex.args[0]) if ex.args else str(ex)
    text = text.split(" (in activation", 1)[0]
    cause = ex.args[2] if len(ex.args) > 2 and ex.args[2] else None
    return f"{text} {cause}" if cause and "no such" in text else text


def evaluate(expression: str, device: Device) -> bool:
    """Whether `device` satisfies one selector expression; SelectorError when it cannot say."""
    runner = compile_selector(expression)
    try:
        result = runner.evaluate({"device": device._cel})
    except CELEvalError as ex:
        raise SelectorError(expression, _runtime_message(ex), runtime=True) from None
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as ex:
        # cel-python lets some Python errors of extension functions through unwrapped.
        raise SelectorError(expression, f"{type(ex).__name__}: {ex}", runtime=True) from None
    if isinstance(result, CELEvalError):
        raise SelectorError(expression, _runtime_message(result), runtime=True)
    if not isinstance(result, celtypes.BoolType):
        raise SelectorError(
            expression, f"must evaluate to bool, got {type(result).__name__}", runtime=True
        )
    return bool(result)


def matches(expressions: Iterable[str], device: Device) -> bool:
    """Whether `device` satisfies every expression (DRA ANDs the selectors of a request)."""
    return all(evaluate(e, device) for e in expressions)
