"""Who a request is attributed to, beside its key and its key's team: its end user and its
tags (docs/teams.md). Read before routing; a bad value is refused with a 400, never cut.

- The end user: the configured header (`DRAFTGATE_USER_HEADER`) where the request carries
  it, else the OpenAI `user` field; at most `END_USER_CHARS` characters.
- The tags: the tags header (`DRAFTGATE_TAGS_HEADER`, `x-draftgate-tags`), comma-separated;
  at most `MAX_TAGS`, each of 1 to `TAG_CHARS` letters, digits and `_.:/=+-`. Stored sorted
  and without repeats as `,a,b,`, so a tag is found with `LIKE '%,a,%'` and a request with
  several tags is counted once, under its set: grouped by tags, the rows add up to the total.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidRequest

END_USER_CHARS = 128
MAX_TAGS = 8
TAG_CHARS = 64
TAG = re.compile(rf"[A-Za-z0-9_.:/=+-]{{1,{TAG_CHARS}}}")


def end_user(header: bytes, payload: Mapping[str, Any]) -> str | None:
    """The request's end user (None: it names none): its header's, else its `user`."""
    if header:
        user: object = header.decode("latin-1").strip()
        param = None
    else:
        user, param = payload.get("user"), "user"
    if not isinstance(user, str) or not user:
        return None
    if len(user) > END_USER_CHARS:
        raise InvalidRequest(
            f"The end user is {len(user)} characters long; at most {END_USER_CHARS} are "
            "accepted (send an id or a hash, not a name)",
            param=param,
            code="invalid_user",
        )
    return user


def tags(header: bytes) -> str | None:
    """The request's tags as stored (`,a,b,`), from its tags header (None: none)."""
    names = sorted({t.strip() for t in header.decode("latin-1").split(",") if t.strip()})
    if not names:
        return None
    if len(names) > MAX_TAGS:
        raise InvalidRequest(
            f"{len(names)} tags; at most {MAX_TAGS} are accepted", code="invalid_tags"
        )
    bad = [t for t in names if not TAG.fullmatch(t)]
    if bad:
        raise InvalidRequest(
            f"Tag {bad[0][:80]!r} is not 1 to {TAG_CHARS} letters, digits or `_.:/=+-`",
            code="invalid_tags",
        )
    return "," + ",".join(names) + ","
