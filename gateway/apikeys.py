"""API key generation and hashing: keys are random, only their SHA-256 is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

KEY_PREFIX = "dg-"
DISPLAY_CHARS = 10


@dataclass(frozen=True)
class NewKey:
    """A freshly generated key: the secret is shown once, then only hash and prefix remain."""

    secret: str
    prefix: str
    sha256: str


def hash_key(secret: str) -> str:
    """Hex SHA-256 of a key (keys carry 256 random bits, so a fast hash is enough)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_key() -> NewKey:
    """A new random API key."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    return NewKey(secret=secret, prefix=secret[:DISPLAY_CHARS], sha256=hash_key(secret))
