"""The one strict loader behind every config moe-dag reads: the pipeline config (`moe_dag.config`), the
model presets (`configs/models/`), `--set` overrides and the resolved config a trainer is handed.

YAML is read by `StrictLoader`: a key given twice in one mapping is refused with the file and both lines
(PyYAML silently keeps the last), and `1e-3` is a float as in YAML 1.2 (PyYAML's YAML 1.1 reads it as
a string). Values are then built into config dataclasses by `build`, driven by the dataclasses' own
field types, so a config class added or split later is checked without touching this module:

- every key must name a field (an unknown key is refused with its key path and the known ones);
- every value must have its field's type exactly: a string is not a number, a bool is not an int, a
  scalar is not a list; a `Literal` field takes one of its values; nested dataclasses are built alike;
- numbers must be finite and not negative, and fields named `*_fraction`, `*_rate`, `*_probability` or
  `*_utilization` lie in [0, 1];
- a field's own range is declared on its type, `Annotated[int, Range(1, 1024)]` (`NON_EMPTY` for a path
  or name that must not be empty), and refused here with the range; `declared_ranges` lists them for the
  docs. Rules across fields of one class are its `__post_init__`'s.

Errors are `ConfigError`s that read `<file>: <key.path>: <problem>`. This lives in the training room
because the trainer loads presets on its own (torchrun needs no pipeline), and the training room imports
nothing above it; the pipeline config's loader builds on it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import keyword
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

UNIT_INTERVAL_SUFFIXES = ("fraction", "rate", "probability", "utilization")


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a field takes, declared on its type: `steps: Annotated[int, Range(1, 10_000_000)]`.
    `above_low`: the low end itself is refused (a weight must be above 0)."""

    low: float
    high: float = math.inf
    above_low: bool = False

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.above_low else '>='} {self.low!r}"
        return f"{'(' if self.above_low else '['}{self.low!r}, {self.high!r}]"

    def refusal(self, value: float) -> str | None:
        too_low = value <= self.low if self.above_low else value < self.low
        if not too_low and value <= self.high:
            return None
        return f"must be {str(self) if self.high == math.inf else f'in {self}'}, got {value!r}"


@dataclasses.dataclass(frozen=True)
class NonEmpty:
    """A path or name that must hold more than blanks (an empty path would mean the working directory)."""

    def __str__(self) -> str:
        return "not empty"

    def refusal(self, value: str | Path) -> str | None:
        return "must not be empty" if not str(value).strip() else None


NON_EMPTY = NonEmpty()


class ConfigError(ValueError):
    """A config value refused: where it was read (a file, `--set`), its key path, and why."""

    def __init__(self, problem: str, key: str = "", origin: str = "") -> None:
        self.problem, self.key, self.origin = problem, key, origin
        super().__init__(": ".join(part for part in (origin, key, problem) if part))

    def within(self, key: str, origin: str = "") -> ConfigError:
        """The error seen from the enclosing mapping at `key`, read from `origin`. An error that already
        names its origin (a preset file named by the pipeline config) stays as it is."""
        if self.origin:
            return self
        return ConfigError(self.problem, join_key(key, self.key), origin)


class WrongType(ConfigError):
    """A value not of its field's type (as opposed to a value of the right type that is out of range)."""


def yaml_key(field_name: str) -> str:
    """The key a field is written as: its name, but `from` for a field named `from_` (a Python keyword
    cannot name a field, so it takes PEP 8's trailing underscore)."""
    bare = field_name.removesuffix("_")
    return bare if bare != field_name and keyword.iskeyword(bare) else field_name


def join_key(parent: str, child: str) -> str:
    if not parent or not child:
        return parent or child
    return f"{parent}{child}" if child.startswith("[") else f"{parent}.{child}"


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys and reading `1e-3` as a float."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise ConfigError(
                    f"duplicate key {key!r} (first at line {first_line[key]})",
                    origin=f"{key_node.start_mark.name}:{line}",
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats without a dot (`1e-3`, `5E+4`); PyYAML's YAML 1.1 resolver wants `1.0e-3`.
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_yaml(path: str | Path) -> Any:
    """The YAML document at `path`; any error names the file and the line."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        loader = StrictLoader(handle)
        loader.name = str(path)
        try:
            return loader.get_single_data()
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise ConfigError(f"not valid YAML: {error.problem or error.context}", origin=where) from None
        finally:
            loader.dispose()


def yaml_value(text: str, origin: str) -> Any:
    """One value written on a command line, read as YAML (`1e-3`, `null`, `[kda, mla]`, `{a: 1}`). A
    comma-separated value outside brackets or quotes is a list: `kda,mla` reads as `[kda, mla]`."""
    text = text.strip()
    if "," in text and text[:1] not in ("[", "{", "'", '"'):
        text = f"[{text}]"
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"not a YAML value: {error}", origin=origin) from None


def nested(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested mappings: {"model.mla.kv_lora_rank": 8} -> {"model": {"mla": {...: 8}}}."""
    tree: dict[str, Any] = {}
    for dotted, value in settings.items():
        *parents, leaf = str(dotted).split(".")
        node = tree
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(parents[: depth + 1])} is set and also has a field set", dotted)
        node[leaf] = value
    return tree


def build(cls: type, values: Any, origin: str, key: str = "", base: Any = None) -> Any:
    """Dataclass `cls` from the mapping `values`, every value checked against its field's type.

    Without `base`, fields left out take their defaults and required fields must be given; with `base`
    (an instance of `cls`), fields left out keep its values: `values` is a partial change of `base`.
    """
    if not isinstance(values, Mapping):
        raise _type_error("a mapping", values, key, origin)
    fields = {yaml_key(f.name): f for f in dataclasses.fields(cls) if f.init}
    for name in values:
        if name not in fields:
            raise ConfigError(_unknown(name, fields), join_key(key, str(name)), origin)
    if base is None:
        for name, f in fields.items():
            given = name in values
            if not given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError("missing (required)", join_key(key, name), origin)
    hints = typing.get_type_hints(cls, include_extras=True)
    kwargs = {
        fields[name].name: coerce(
            hints[fields[name].name],
            value,
            origin,
            join_key(key, name),
            None if base is None else getattr(base, fields[name].name),
        )
        for name, value in values.items()
    }
    try:
        return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)
    except ConfigError as error:
        raise error.within(key, origin) from None
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise ConfigError(str(error), key, origin) from None


def update(instance: Any, values: Mapping[str, Any], origin: str, key: str = "") -> Any:
    """`instance` with the (nested) fields of `values` changed, checked as `build` checks them."""
    return build(type(instance), values, origin, key, base=instance)


def checked_changes(cls: type, values: Any, origin: str, key: str) -> dict[str, Any]:
    """Some fields of dataclass `cls`, each checked as `build` checks it, returned as a mapping (a change
    that its owner applies later, such as a source's changes to the prefilter section); a nested
    config dataclass takes some of its own fields in turn."""
    if not isinstance(values, Mapping):
        raise _type_error("a mapping", values, key, origin)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls, include_extras=True)
    changes = {}
    for name, value in values.items():
        if name not in fields:
            raise ConfigError(_unknown(name, fields), join_key(key, str(name)), origin)
        hint, where = hints[name], join_key(key, name)
        if dataclasses.is_dataclass(hint):
            changes[name] = checked_changes(hint, value, origin, where)
        else:
            changes[name] = coerce(hint, value, origin, where)
    return changes


def coerce(annotation: Any, value: Any, origin: str, key: str, base: Any = None) -> Any:
    """`value` checked against the field type `annotation`; nested dataclasses built (onto `base`)."""
    origin_type, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin_type in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            nested_base = base if dataclasses.is_dataclass(option) and isinstance(base, option) else None
            try:
                return coerce(option, value, origin, key, nested_base)
            except ConfigError as error:
                errors.append(error)
        # An option whose type the value has refused it for what it is: say that, not the union's types.
        precise = [error for error in errors if error.key != key or not isinstance(error, WrongType)]
        raise precise[0] if precise else _type_error(annotation, value, key, origin)
    if origin_type is typing.Annotated:
        checked = coerce(args[0], value, origin, key, base)
        for bound in _bounds(annotation):
            problem = bound.refusal(checked)
            if problem:
                raise ConfigError(problem, key, origin)
        return checked
    if dataclasses.is_dataclass(annotation):
        return build(annotation, value, origin, key, base)
    if origin_type is Literal:
        if value not in args or isinstance(value, bool) != any(isinstance(a, bool) for a in args):
            raise WrongType(f"expected {describe(annotation)}, got {value!r}", key, origin)
        return value
    if origin_type in (list, tuple):
        if not isinstance(value, list | tuple):
            raise _type_error(annotation, value, key, origin)
        items = [coerce(args[0], item, origin, f"{key}[{i}]") for i, item in enumerate(value)]
        return items if origin_type is list else tuple(items)
    if origin_type is dict:
        if not isinstance(value, Mapping):
            raise _type_error(annotation, value, key, origin)
        return {
            coerce(args[0], name, origin, f"{key} key {name!r}"): coerce(
                args[1], item, origin, join_key(key, str(name))
            )
            for name, item in value.items()
        }
    if annotation is bool:
        if not isinstance(value, bool):
            raise _type_error(annotation, value, key, origin)
        return value
    if annotation in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(annotation, value, key, origin)
        if annotation is int and not float(value).is_integer():
            raise _type_error(annotation, value, key, origin)
        return _checked_number(annotation(value), key, origin)
    if annotation in (str, Path):
        if not isinstance(value, str | Path):
            raise _type_error(annotation, value, key, origin)
        return annotation(value)
    return value


def check_ranges(instance: Any) -> None:
    """Refuse a field of dataclass `instance` outside the range its type declares: called by each
    `__post_init__` of a class with ranges, so a config made in code holds them as a loaded one does."""
    for name, bounds in _field_bounds(type(instance)).items():
        value = getattr(instance, name)
        for bound in bounds if value is not None else ():
            problem = bound.refusal(value)
            if problem:
                raise ConfigError(problem, name)


@functools.cache
def _field_bounds(cls: type) -> dict[str, list[Range | NonEmpty]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    bounds = {f.name: _bounds(hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    return {name: found for name, found in bounds.items() if found}


def _bounds(hint: Any) -> list[Range | NonEmpty]:
    """The ranges an annotation declares, on the field itself or on its non-null option."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [b for option in typing.get_args(hint) for b in _bounds(option)]
    if typing.get_origin(hint) is typing.Annotated:
        return [b for b in hint.__metadata__ if isinstance(b, Range | NonEmpty)]
    return []


def declared_ranges(cls: type, key: str = "") -> dict[str, Range | NonEmpty]:
    """Each field of dataclass `cls` (nested ones by key path; a list's items as `name[]`, a mapping's
    values as `name.NAME`) with the range its type declares."""
    ranges: dict[str, Range | NonEmpty] = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for name, hint in ((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init):
        where = join_key(key, name)
        while typing.get_origin(hint) in (list, dict, typing.Union, types.UnionType):
            kind, options = typing.get_origin(hint), [a for a in typing.get_args(hint) if a is not type(None)]
            where += {list: "[]", dict: ".NAME"}.get(kind, "")
            hint = options[-1]
        bounds = _bounds(hint)
        if bounds:
            ranges[where] = bounds[0]  # one range a field
        elif dataclasses.is_dataclass(hint):
            ranges.update(declared_ranges(hint, where))
    return ranges


def describe(annotation: Any) -> str:
    """A field type as a reader of the YAML would write it: `int`, `float | null`, `one of [...]`."""
    if annotation is type(None):
        return "null"
    origin_type, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin_type in (typing.Union, types.UnionType):
        return " | ".join(describe(a) for a in args)
    if origin_type is typing.Annotated:
        return describe(args[0])
    if origin_type is Literal:
        return f"one of {list(args)}"
    if origin_type is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def _type_error(annotation: Any, value: Any, key: str, origin: str) -> ConfigError:
    expected = annotation if isinstance(annotation, str) else describe(annotation)
    return WrongType(f"expected {expected}, got {type(value).__name__} {value!r}", key, origin)


def _checked_number(number: float, key: str, origin: str) -> float:
    name = key.rsplit(".", 1)[-1]
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"must be a finite number >= 0, got {number!r}", key, origin)
    if name.endswith(UNIT_INTERVAL_SUFFIXES) and number > 1:
        raise ConfigError(f"must lie between 0 and 1, got {number!r}", key, origin)
    return number


def _unknown(name: Any, fields: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(str(name), list(fields), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (known: {', '.join(sorted(fields))})"
