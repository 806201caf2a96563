"""Secrets the gateway must send on but no one should read back: backend API keys, sealed in
the database so that a dump or a copy of the file alone does not reveal them.

Sealed with Fernet (AES-128-CBC and HMAC-SHA256, from `cryptography`) under the keys of
`DRAFTGATE_SECRETS_KEY` or the file `DRAFTGATE_SECRETS_KEY_FILE` names: several, separated by
commas, rotate them (the first seals, any opens). A sealed value is stored as
`sealed:<token>`; a value without that prefix is one stored before keys were set, read as it
is and sealed at the next start with a key. With no key set, values are stored as given
(the gateway says so at start when a backend has a key). `draftgate up` makes a key of its
own, kept in `.draftgate/secrets-key` (0600).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import Dialect, Text
from sqlalchemy.types import TypeDecorator

PREFIX = "sealed:"
_keys: MultiFernet | None = None  # set once at start (`use_keys`): the process's keys
_first: Fernet | None = None  # the one that seals


class SealedWithoutKey(Exception):
    """A sealed value that the configured keys cannot open; the message says what to set."""


def use_keys(keys: Sequence[str]) -> None:
    """Seal with the first of `keys` and open with any (none: store values as given); the
    settings have checked that each is a Fernet key."""
    global _keys, _first
    fernets = [Fernet(key) for key in keys]
    _keys, _first = (MultiFernet(fernets), fernets[0]) if fernets else (None, None)


def sealing() -> bool:
    """Whether values are sealed as they are stored."""
    return _keys is not None


def stale(stored: str | None) -> bool:
    """Whether a stored value should be sealed again: stored as given, or under a key that
    no longer seals."""
    if stored is None or _first is None:
        return False
    if not stored.startswith(PREFIX):
        return True
    try:
        _first.decrypt(stored.removeprefix(PREFIX).encode())
    except InvalidToken:
        return True
    return False


def new_key() -> str:
    return Fernet.generate_key().decode()


def seal(value: str | None) -> str | None:
    """`value` as stored: sealed when keys are set (a sealed one is not sealed again)."""
    if value is None or _keys is None or value.startswith(PREFIX):
        return value
    return PREFIX + _keys.encrypt(value.encode()).decode()


def unseal(stored: str | None) -> str | None:
    """A stored value as given (SealedWithoutKey when no configured key opens it)."""
    if stored is None or not stored.startswith(PREFIX):
        return stored
    if _keys is None:
        raise SealedWithoutKey(
            "a backend API key in the database is sealed, and no DRAFTGATE_SECRETS_KEY (or "
            "DRAFTGATE_SECRETS_KEY_FILE) is set to open it"
        )
    try:
        return _keys.decrypt(stored.removeprefix(PREFIX).encode()).decode()
    except InvalidToken:
        raise SealedWithoutKey(
            "a backend API key in the database was sealed with a key that is not among "
            "DRAFTGATE_SECRETS_KEY's (keep the old key after the new one while rotating)"
        ) from None


class Sealed(TypeDecorator[str]):
    """A text column stored sealed (see the module's docstring)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return seal(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return unseal(value)
