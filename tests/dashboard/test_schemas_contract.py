"""dashboard/schemas.py held against the gateway's /openapi.json: each record the dashboard
reads is a subset of the API's schema of it, and every field's type takes whatever the API
may send there (a `float` takes an integer, an Optional takes an omitted or null value)."""

from __future__ import annotations

import datetime as dt
import inspect
import types
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, Field

from dashboard import schemas
from dashboard.schemas import Policy, Record
from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN, READ_TOKEN

Schema = dict[str, Any]

# Dashboard records whose API schema has another name; the rest share their API schema's.
SCHEMA_OF = {
    "Accuracy": "AccuracyReport",
    "ApiKey": "KeyPublic",
    "AuditEntry": "AuditPublic",
    "Backend": "BackendPublic",
    "Benchmark": "BenchmarkPublic",
    "Capacity": "CapacityPlan",
    "CreatedKey": "KeyCreated",
    "Curves": "CurvesReport",
    "DecodingMethod": "MethodPublic",
    "Fit": "PlanFit",
    "Fleet": "FleetReport",
    "Gpu": "GpuPublic",
    "GpuPrice": "GpuDefaultPrice",
    "Measurement": "MeasurementPublic",
    "ModelInfo": "ModelPublic",
    "Move": "MovePublic",
    "Plan": "PlanReport",
    "Pool": "PoolPublic",
    "PoolBackend": "PoolTemplatePublic",
    "PoolDns": "DnsDiscovery",
    "PoolService": "KubernetesDiscovery",
    "Price": "PricePublic",
    "Spend": "SpendReport",
    "Team": "TeamPublic",
    "Usage": "SavingsReport",
    "UsageRow": "SavingsRow",  # the API's UsageRow is a record of GET /usage, not a total
}
# Records the document cannot hold, and why.
NOT_IN_THE_DOCUMENT = {
    "BenchmarkLevel": "a level of BenchmarkPublic.result, which the API types as a free object",
}
SCALARS: dict[object, tuple[str, ...]] = {  # a dashboard type and the JSON types it takes
    str: ("string",),
    int: ("integer",),
    float: ("number", "integer"),
    bool: ("boolean",),
}
FORMATS = {dt.datetime: "date-time", dt.date: "date"}


def _records() -> list[type[Record]]:
    return [
        cls
        for _, cls in inspect.getmembers(schemas, inspect.isclass)
        if issubclass(cls, Record) and cls is not Record and cls.__module__ == schemas.__name__
    ]


def _schema_name(record: type[BaseModel]) -> str:
    return SCHEMA_OF.get(record.__name__, record.__name__)


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Schema]:
    """The component schemas of the gateway's /openapi.json, built in-process."""
    database = tmp_path_factory.mktemp("contract") / "draftgate.db"
    settings = Settings(
        database_url=f"sqlite:///{database}", admin_token=ADMIN_TOKEN, admin_read_token=READ_TOKEN
    )
    document: Schema = create_app(settings).openapi()
    found: dict[str, Schema] = document["components"]["schemas"]
    return found


def _alternatives(schema: Schema) -> list[Schema]:
    """The API's schema as the plain schemas any of which a value may match."""
    if "anyOf" in schema:
        return [one for part in schema["anyOf"] for one in _alternatives(part)]
    return [schema]


def _values(schema: Schema) -> list[Schema]:
    """The schemas of an API object's values; an empty one where any value may appear."""
    values = list(schema.get("patternProperties", {}).values())
    extra = schema.get("additionalProperties", not values)
    if isinstance(extra, dict):
        return [*values, extra]
    return [*values, {}] if extra is True else values


def takes(annotation: object, schema: Schema) -> bool:
    """Whether a dashboard field of type `annotation` validates every value `schema` allows."""
    return all(_takes_one(annotation, one) for one in _alternatives(schema))


def _takes_one(annotation: object, schema: Schema) -> bool:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_takes_one(arg, schema) for arg in args)
    if schema.get("type") == "null":
        return annotation is type(None)
    if origin is Literal:
        return bool(schema.get("enum")) and set(schema["enum"]) <= set(args)
    if origin is list:
        return schema.get("type") == "array" and takes(args[0], schema.get("items", {}))
    if origin is tuple:
        items = schema.get("prefixItems", [])
        fixed = schema.get("maxItems") == len(items) == len(args)
        return fixed and all(takes(arg, item) for arg, item in zip(args, items, strict=True))
    if origin is dict:
        if args[1] is Any:
            return schema.get("type") == "object" or "$ref" in schema
        return schema.get("type") == "object" and all(takes(args[1], v) for v in _values(schema))
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return schema.get("$ref") == f"#/components/schemas/{_schema_name(annotation)}"
    if annotation in FORMATS:
        return schema.get("type") == "string" and schema.get("format") == FORMATS[annotation]
    return annotation in SCALARS and schema.get("type") in SCALARS[annotation]


def _describe(schema: Schema) -> str:
    """The API's type of a field, for a failure's message."""
    if len(parts := _alternatives(schema)) > 1:
        return " | ".join(_describe(part) for part in parts)
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[1]
    shown = {k: v for k, v in schema.items() if k in ("type", "format", "enum", "items")}
    return str(shown or "any value")


def mismatches(
    record: type[BaseModel], schema_name: str, components: dict[str, Schema]
) -> list[str]:
    """How `record` is not a subset of the API's `schema_name`, field by field."""
    schema = components[schema_name]
    properties: dict[str, Schema] = schema.get("properties", {})
    required = set(schema.get("required", []))
    found = []
    for name, field in record.model_fields.items():
        key = field.alias or name
        api = properties.get(key)
        where = f"{record.__name__}.{name} ({schema_name}.{key})"
        if api is None:
            found.append(f"{where}: not in the API's schema")
            continue
        # The gateway answers its response models whole: a field with a default is always sent.
        if field.is_required() and key not in required and "default" not in api:
            found.append(f"{where}: required here, but the API may leave it out")
        if not takes(field.annotation, api):
            shown = (
                field.annotation.__name__ if inspect.isclass(field.annotation) else field.annotation
            )
            found.append(f"{where}: {shown} does not take the API's {_describe(api)}")
    return found


CHECKED = [r for r in _records() if r.__name__ not in NOT_IN_THE_DOCUMENT]


@pytest.mark.parametrize("record", CHECKED, ids=lambda r: r.__name__)
def test_every_record_is_a_subset_of_its_api_schema(
    record: type[Record], components: dict[str, Schema]
) -> None:
    assert _schema_name(record) in components, f"no schema {_schema_name(record)} in the API"
    found = mismatches(record, _schema_name(record), components)
    assert not found, "\n".join(found)


def test_the_table_names_only_records_and_schemas_that_exist(components: dict[str, Schema]) -> None:
    names = {r.__name__ for r in _records()}
    assert set(SCHEMA_OF) | set(NOT_IN_THE_DOCUMENT) <= names
    assert set(SCHEMA_OF.values()) <= set(components)
    assert not set(NOT_IN_THE_DOCUMENT) & set(components)


def test_a_policy_the_dashboard_saves_keeps_every_field_of_the_api(
    components: dict[str, Schema],
) -> None:
    """The Methods page PUTs its whole `Policy` back: a field it did not know would be reset."""
    fields = {field.alias or name for name, field in Policy.model_fields.items()}
    assert fields == set(components[_schema_name(Policy)]["properties"])


# Records drifted from the API in one way each, and what the contract says of them.


class Renamed(Record):
    gpu: str  # PricePublic's gpu_type


class Narrowed(Record):
    usd_per_gpu_hour: int  # a number there


class AnotherFormat(Record):
    date: dt.datetime  # a date there


class NotNullable(Record):
    budget_usd: float  # null there: no budget


class RequiredHere(Record):
    move: schemas.Move | None  # left out there when no move is under way


class AnotherRecord(Record):
    policy: schemas.Move  # a Policy there


class FewerChoices(Record):
    kind: Literal["spot"]  # on-demand, reserved or spot there


class AnotherAlias(Record):
    start: str = Field(alias="since")  # Crossover's is `from`


DRIFTED: list[tuple[type[Record], str, str]] = [
    (Renamed, "PricePublic", "Renamed.gpu (PricePublic.gpu): not in the API's schema"),
    (Narrowed, "PricePublic", "int does not take the API's {'type': 'number'}"),
    (AnotherFormat, "PricePublic", "datetime does not take the API's {'type': 'string', 'format"),
    (NotNullable, "KeyPublic", "float does not take the API's {'type': 'number'} | {'type': 'nu"),
    (RequiredHere, "ModelPublic", "RequiredHere.move (ModelPublic.move): required here, but"),
    (AnotherRecord, "ModelPublic", "Move does not take the API's Policy"),
    (FewerChoices, "GpuDefaultPrice", "Literal['spot'] does not take the API's {'type': 'str"),
    (AnotherAlias, "Crossover", "AnotherAlias.start (Crossover.since): not in the API's schema"),
]


@pytest.mark.parametrize(
    ("record", "schema_name", "said"), DRIFTED, ids=[d[0].__name__ for d in DRIFTED]
)
def test_a_drifted_record_is_caught(
    record: type[Record], schema_name: str, said: str, components: dict[str, Schema]
) -> None:
    found = mismatches(record, schema_name, components)
    assert len(found) == 1, found
    assert said in found[0]
