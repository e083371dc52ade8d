"""DRA device selectors evaluated with a real CEL implementation (cel-python).

The operator must know which MIG profiles would satisfy a pending ResourceClaim before any
device of that profile exists: it evaluates the DeviceClass and request selectors against a
*virtual* device of each profile, built exactly like the device the ResourceSlice will publish
(`migpart.slices.content.slice_device` is that one definition; the slice publisher uses it too,
so that the two never disagree).

cel-python implements the CEL language and its standard functions; Kubernetes adds libraries
that DRA selectors use in practice, implemented with Kubernetes semantics in `cel_library.py`:

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, CELSyntaxError, CELUnsupportedError, base_functions

from migpart.errors import InvalidInput, SelectorError
from migpart.kube.cel_library import FUNCTIONS, Quantity, Semver
from migpart.slices.content import slice_device
from migpart.slices.dra import DRIVER

if TYPE_CHECKING:
    from migpart.mig.profiles import ModelTable


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


_OPERATORS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
}
_OVERLOAD = re.compile(r"no matching overload for Token\('\w+', '(\w+)'\) applied to '\((.*)\)'")
_PYTHON_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+?)(?:Type)?'>")


def _runtime_message(ex: CELEvalError, device: Device | None = None) -> str:
    """cel-python's message, in CEL's words: operators and type names instead of parser
    tokens and Python classes, and for a missing key the names the device does have."""
    text = str(ex.args[0]) if ex.args else str(ex)
    text = text.split(" (in activation", 1)[0]
    overload = _OVERLOAD.search(text)
    if overload:
        operator = _OPERATORS.get(overload.group(1), overload.group(1))
        types = ", ".join(m.lower() for m in _PYTHON_CLASS.findall(overload.group(2)))
        return (
            f"found no matching overload for {operator} applied to ({types}): compare values"
            ' of one type (quantity("10Gi") for capacity, semver("1.2.3") for versions)'
        )
    cause = ex.args[2] if len(ex.args) > 2 and ex.args[2] else None
    if cause and "no such" in text:
        text = f"{text} {cause}"
    if device is None or "no such" not in text:
        return text
    attributes = ", ".join(sorted(device.attributes.get(device.driver, {})))
    capacity = ", ".join(sorted(device.capacity.get(device.driver, {})))
    return (
        f"{text} ({device.driver} devices have attributes {attributes} and capacity"
        f" {capacity}; other domains are empty)"
    )


def evaluate(expression: str, device: Device) -> bool:
    """Whether `device` satisfies one selector expression; SelectorError when it cannot say."""
    runner = compile_selector(expression)
    try:
        result = runner.evaluate({"device": device._cel})
    except CELEvalError as ex:
        raise SelectorError(expression, _runtime_message(ex, device), runtime=True) from None
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as ex:
        # cel-python lets some Python errors of extension functions through unwrapped.
        raise SelectorError(expression, f"{type(ex).__name__}: {ex}", runtime=True) from None
    if isinstance(result, CELEvalError):
        raise SelectorError(expression, _runtime_message(result, device), runtime=True)
    if not isinstance(result, celtypes.BoolType):
        raise SelectorError(
            expression, f"must evaluate to bool, got {type(result).__name__}", runtime=True
        )
    return bool(result)


def matches(expressions: Iterable[str], device: Device) -> bool:
    """Whether `device` satisfies every expression (DRA ANDs the selectors of a request)."""
    return all(evaluate(e, device) for e in expressions)
