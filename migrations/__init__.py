"""Alembic migrations; applied by `draftgate db upgrade` and at gateway start."""
