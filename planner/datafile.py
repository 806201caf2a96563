"""Reading validated records from the planner's YAML data files into frozen dataclasses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import MISSING, fields
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

import yaml

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PriceKind = Literal["on-demand", "reserved", "spot"]
WeightDtype = Literal["bf16", "fp8", "mxfp4"]
PRICE_KINDS: tuple[PriceKind, ...] = get_args(PriceKind)
WEIGHT_DTYPES: tuple[WeightDtype, ...] = get_args(WeightDtype)
Fraction = float  # a number in [0, 1]
NonNegative = float  # a number >= 0


class CatalogError(ValueError):
    """A data file is malformed; the message names the file and the entry."""


_D = TypeVar("_D", bound="DataclassInstance")
# libyaml's parser where PyYAML has it (its wheels do): the same safe constructor, about ten
# times faster on the calibration files the planner reads again and again.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _is_number(value: object) -> bool:
    """An int or float, but not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_date(value: object) -> dt.date | None:
    """A date from YAML (already parsed, or a YYYY-MM-DD string); None if it is not one."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    try:
        return dt.date.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


# By field annotation: (accepts the raw value?, what was expected, conversion).
# An `X | None` field also accepts null; a field with a default may be left out.
_Reader = tuple[Callable[[Any], bool], str, Callable[[Any], object]]
READERS: dict[str, _Reader] = {
    "str": (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string", str.strip),
    "tuple[str, ...]": (
        lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v),
        "a list of non-empty strings",
        tuple,
    ),
    "float": (lambda v: _is_number(v) and v > 0, "a positive number", float),
    "int": (lambda v: _is_number(v) and isinstance(v, int) and v > 0, "a positive integer", int),
    "Fraction": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]", float),
    "NonNegative": (lambda v: _is_number(v) and v >= 0, "a number >= 0", float),
    "bool": (lambda v: isinstance(v, bool), "true or false", bool),
    "dt.date": (lambda v: _as_date(v) is not None, "a YYYY-MM-DD date", _as_date),
    "PriceKind": (lambda v: v in PRICE_KINDS, f"one of {list(PRICE_KINDS)}", str),
    "WeightDtype": (lambda v: v in WEIGHT_DTYPES, f"one of {list(WEIGHT_DTYPES)}", str),
}


def _entry_label(raw: object, index: int) -> str:
    """How error messages name an entry: its name, its GPU and kind, or its position."""
    if not isinstance(raw, dict) or not (label := raw.get("name") or raw.get("gpu_type")):
        return f"#{index}"
    return f"{label} ({raw['kind']})" if "kind" in raw else str(label)


def _build(cls: type[_D], raw: object, where: str) -> _D:
    """An instance of dataclass `cls` read and validated from one raw entry."""
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: must be a mapping")
    known = {f.name: f for f in fields(cls)}
    if unknown := sorted(set(raw) - set(known)):
        raise CatalogError(f"{where}: unknown keys {unknown}")
    values: dict[str, object] = {}
    for name, field in known.items():
        if name not in raw:
            if field.default is MISSING:
                raise CatalogError(f"{where}: missing required key {name!r}")
            continue
        annotation = str(field.type)
        if raw[name] is None and annotation.endswith(" | None"):
            values[name] = None
            continue
        accepts, expected, convert = READERS[annotation.removesuffix(" | None")]
        if not accepts(raw[name]):
            raise CatalogError(f"{where}: {name!r} must be {expected}, got {raw[name]!r}")
        values[name] = convert(raw[name])
    return cls(**values)


def load_entries(file: Traversable | Path, key: str, cls: type[_D]) -> tuple[_D, ...]:
    """Parse `file` as {key: [entry, ...]} into instances of `cls`, validating each."""
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506
    except yaml.YAMLError as exc:
        raise CatalogError(f"{file.name}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get(key), list) or not data[key]:
        raise CatalogError(f"{file.name}: must be a mapping with a non-empty {key!r} list")
    return tuple(
        _build(cls, raw, f"{file.name}: entry {_entry_label(raw, i)!r}")
        for i, raw in enumerate(data[key])
    )
