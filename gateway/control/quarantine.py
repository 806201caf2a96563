"""The leader's round over the lossless watchdog's checks: quarantine what they condemn
(gateway/services/quarantine.py), say so in the log and by webhook, and refresh routing."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.session import transaction
from gateway.events.webhooks import WebhookSender, method_quarantined
from gateway.registry import Registry
from gateway.services.quarantine import quarantine_due

logger = logging.getLogger(__name__)


def _round(
    sessions: sessionmaker[Session], threshold: float, min_checks: int
) -> list[tuple[int, str, str, dict[str, object]]]:
    with transaction(sessions) as session:
        made = quarantine_due(session, threshold, min_checks)
        return [(q.id, q.model, q.method, dict(q.evidence)) for q in made]


async def quarantine_forever(
    sessions: sessionmaker[Session],
    registry: Registry,
    webhooks: WebhookSender | None,
    stop: asyncio.Event,
    *,
    threshold: float,
    min_checks: int,
    interval_s: float,
) -> None:
    """Every `interval_s` until `stop`: quarantine, log, emit `method.quarantined`, refresh."""
    while not stop.is_set():
        try:
            made = await asyncio.to_thread(_round, sessions, threshold, min_checks)
        except SQLAlchemyError as exc:  # the database is away: next round
            logger.warning("lossless quarantines not checked this round: %s", exc)
            made = []
        for quarantine_id, model, method, evidence in made:
            policy = registry.snapshot.policies.get(model)
            pinned = policy is not None and policy.mode == "pinned" and policy.method == method
            logger.warning(
                "lossless watchdog: quarantined %s of %s (%s of %s checks diverged from %s)%s",
                method, model, evidence["divergences"], evidence["samples"],
                evidence["reference_method"],
                "; it is pinned, so it still serves: pin another method" if pinned else "",
            )  # fmt: skip
            if webhooks is not None:
                webhooks.emit(method_quarantined(model, method, quarantine_id, evidence))
        if made:
            registry.request_refresh()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
