"""Where each stored response lives (the Responses API).

A vLLM server started with `VLLM_ENABLE_RESPONSES_API_STORE=1` keeps every response it
makes, in its own memory: a later turn naming it (`previous_response_id`), and
`GET /v1/responses/{id}` or its `/cancel`, work only on that server. With a pool of members
behind one model, the gateway must send them there. Each Responses API request's ledger
record keeps the id of the response its backend made (`usage_records.response_id`); a
replica knows its own at once and finds another replica's in the database, written within
the ledger's flush interval (so an id it does not know is looked up again once after that
interval before the request is routed as any other).

A response is its key's (or, made for a token, its team's): a key asking for another key's
response is told it does not exist, as the backend cannot tell (vLLM's store has no owner).
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.tables import RESPONSE_ID, UsageRecord
from gateway.errors import InvalidRequest, ResponseNotFound
from gateway.registry import KeyView

RESPONSES_PATH = "/v1/responses"
STORED_RESPONSES = "/v1/responses/"  # GET /v1/responses/{id}, POST /v1/responses/{id}/cancel
RESPONSE_ID_FORMAT = re.compile(rf"^[A-Za-z0-9_-]{{1,{RESPONSE_ID}}}$")
KNOWN = 100_000  # ids kept in memory per process (about 15 MB); older ones are read again


@dataclass(frozen=True, slots=True)
class Home:
    """The backend holding a stored response, and the key whose it is."""

    backend: str
    api_key_id: int | None
    team_id: int | None = None  # the team it was served for

    def owned_by(self, key: KeyView | None) -> bool:
        """Whether `key` (None: a keyless caller) may use it: a key its own, a team caller
        (a token's) its team's made without a key, a keyless caller those of neither."""
        if key is None:
            return self.api_key_id is None and self.team_id is None
        if key.team_caller:
            return self.api_key_id is None and self.team_id == key.team_id
        return self.api_key_id == key.id


class ResponseHomes:
    """Stored responses' backends: this process's in memory, every replica's in the ledger."""

    def __init__(self, sessions: sessionmaker[Session], settle_s: float) -> None:
        self._sessions = sessions
        self._settle_s = settle_s  # how long another replica's record may take to be written
        self._known: OrderedDict[str, Home] = OrderedDict()

    def remember(self, response_id: str, home: Home) -> None:
        self._known[response_id] = home
        self._known.move_to_end(response_id)
        if len(self._known) > KNOWN:
            self._known.popitem(last=False)

    async def find(self, response_id: str) -> Home | None:
        """The response's home, or None when no replica has recorded it."""
        if (home := self._known.get(response_id)) is not None:
            return home
        for wait in (0.0, self._settle_s):
            await asyncio.sleep(wait)
            home = await asyncio.to_thread(self._read, response_id)
            if home is not None:
                self.remember(response_id, home)
                return home
        return None

    def _read(self, response_id: str) -> Home | None:
        query = (
            select(UsageRecord.backend_name, UsageRecord.api_key_id, UsageRecord.team_id)
            .where(UsageRecord.response_id == response_id)
            .where(UsageRecord.backend_name.is_not(None))
            .order_by(UsageRecord.id.desc())
            .limit(1)
        )
        with self._sessions() as session:
            row = session.execute(query).first()
        return None if row is None else Home(row.backend_name, row.api_key_id, row.team_id)


def checked_id(value: object, param: str) -> str:
    """A response id as the client gave it, or a 400 naming `param`."""
    if not isinstance(value, str) or not RESPONSE_ID_FORMAT.match(value):
        raise InvalidRequest(f"`{param}` is not a response id", param=param)
    return value


def not_found(response_id: str, param: str) -> ResponseNotFound:
    """vLLM's own answer for an id it does not hold."""
    return ResponseNotFound(f"Response with id '{response_id}' not found.", param=param)
