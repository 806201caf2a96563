"""What runs once per gateway replica, in the worker process that leads it.

With one process (the default) that process leads at once. With worker processes
(gateway/server/workers.py) each follows the leader's choices until it holds the leader lock
(gateway/server/replica.py), then runs these loops until the stop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from sqlalchemy.orm import Session, sessionmaker

from gateway.control.benchmarks import BenchmarkManager
from gateway.control.collector import Collector
from gateway.control.discovery import Discovery
from gateway.control.dns import Resolver
from gateway.control.kube import ServiceAccount
from gateway.control.quarantine import quarantine_forever
from gateway.control.readiness import publish_readiness
from gateway.control.retention import prune_forever
from gateway.control.selector import PriceGauges, Selector
from gateway.events.webhooks import WebhookSender
from gateway.metrics import GatewayMetrics
from gateway.registry import Registry
from gateway.server.replica import Leadership, Replica, follow_choices, publish_forever
from gateway.services.rightsizing import Sizing
from gateway.settings import Settings


@dataclass
class Leader:
    """What runs once per replica, in the worker that leads it (gateway/server/replica.py): the
    selector, retention, the readiness gauge, webhooks, measurement writes, benchmark runs
    and, with worker processes, publishing the selector's choices and the replica's gauges
    to the others."""

    settings: Settings
    sessions: sessionmaker[Session]
    registry: Registry
    metrics: GatewayMetrics
    collector: Collector
    benchmarks: BenchmarkManager
    webhooks: WebhookSender | None
    replica: Replica | None
    client: httpx.AsyncClient  # the control plane's, for probing members before they join
    leadership: Leadership | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the leader's choices until this worker leads, then lead until `stop`."""
        following = None
        if self.replica is not None:
            following = asyncio.create_task(
                follow_choices(self.replica.choices_file, self.registry, stop)
            )
        self.leadership = Leadership(self.replica)  # holds the lock while this process lives
        leads = await self.leadership.acquire(stop)
        if following is not None:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        if leads:
            await self._lead(stop)
        self.leadership.release()

    async def _lead(self, stop: asyncio.Event) -> None:
        settings, metrics = self.settings, self.metrics
        metrics.leader_gauges_file = None  # this worker's own, from now on
        self.collector.stores = True
        selector = Selector(
            self.registry,
            self.sessions,
            interval_s=settings.selector_interval_s,
            min_dwell_s=settings.selector_min_dwell_s,
            switch_margin=settings.selector_switch_margin,
            sizing=Sizing.of(settings),
            desired_replicas=metrics.desired_replicas,
            move_steps=(settings.move_step_share, settings.move_step_s),
            webhooks=self.webhooks,
            prices=PriceGauges(metrics.method_usd_per_mtok, metrics.plain_usd_per_mtok),
            in_flight=metrics.in_flight_by_backend,
            queued=metrics.queued_by_model,
            load_window_s=settings.selector_load_window_s,
        )
        ready = metrics.ready
        discovery = Discovery(
            self.sessions,
            self.client,
            Resolver.parse(settings.dns_server),
            settings.discovery_interval_s,
            metrics.pool_discovery_ok,
            settings.allow_link_local_backends,
            self.registry.request_refresh,
            ServiceAccount.in_cluster(settings.kube_service_account_dir, settings.kube_api_url),
        )
        loops = [
            discovery.run(stop),
            selector.run(stop),
            prune_forever(self.sessions, settings.usage_retention_days, metrics, stop),
            publish_readiness(self.sessions, self.registry, ready, settings.probe_interval_s, stop),
            self.benchmarks.run(stop),
            quarantine_forever(
                self.sessions,
                self.registry,
                self.webhooks,
                stop,
                threshold=settings.lossless_quarantine_rate,
                min_checks=settings.lossless_quarantine_min_checks,
                interval_s=settings.lossless_quarantine_interval_s,
            ),
        ]
        if self.webhooks is not None:  # at the stop, queued events get a short grace to go out
            self.webhooks.lead()
            loops.append(self.webhooks.run(stop))
        if self.replica is not None:
            loops.append(publish_forever(self.replica, self.registry, metrics.leader_gauges, stop))
        await asyncio.gather(*loops)
