"""Applying a partial update to a resource, validated as a whole."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.errors import validation_failed

ModelT = TypeVar("ModelT", bound=BaseModel)


def merged(model: type[ModelT], current: dict[str, Any], patch: BaseModel) -> ModelT:
    """Validate `current` with `patch`'s explicitly set keys applied, as a whole."""
    changes = patch.model_dump(mode="json", exclude_unset=True)
    try:
        return model.model_validate({**current, **changes})
    except ValidationError as exc:
        raise validation_failed(exc.errors()) from exc
