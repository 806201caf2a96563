"""A Service's ready endpoints through the Kubernetes API's list + watch (gateway/control/kube.py),
against the stand-in API server of tests/kube_api.py on loopback (its docstring says why not a
real one), whose slices the tests change while the watch runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from gateway.control.kube import EndpointSliceWatch, ServiceAccount
from tests.kube_api import KubeApi

TOKEN = "stand-in-service-account-token"
NS = "serving"
DEADLINE_S = 20.0


@pytest.fixture
def api() -> Iterator[KubeApi]:
    with KubeApi(TOKEN, {NS}) as server:
        yield server


def account(api: KubeApi, tmp_path: Path, token: str = TOKEN) -> ServiceAccount:
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "namespace").write_text(NS)
    return ServiceAccount.in_cluster(tmp_path, api.url)  # type: ignore[return-value]


async def until(condition: Callable[[], bool]) -> None:
    """Wait for `condition` (a deadline, not a wait)."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not seen within {DEADLINE_S} s")
        await asyncio.sleep(0.02)


@pytest.fixture
async def watching(
    api: KubeApi, tmp_path: Path
) -> AsyncIterator[Callable[..., EndpointSliceWatch]]:
    tasks: list[asyncio.Task[None]] = []
    sa = account(api, tmp_path)
    client = sa.client()

    def start(service: str = "vllm-plain", namespace: str = NS) -> EndpointSliceWatch:
        watch = EndpointSliceWatch(client, sa, namespace, service)
        tasks.append(asyncio.create_task(watch.run()))
        return watch

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()


def test_the_service_account_is_read_from_its_directory(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0k3n\n")
    (tmp_path / "namespace").write_text("serving\n")
    sa = ServiceAccount.in_cluster(tmp_path, "http://127.0.0.1:1/")
    assert sa is not None
    assert (sa.api_url, sa.namespace, sa.ca_file) == ("http://127.0.0.1:1", "serving", None)
    assert sa.headers() == {"Authorization": "Bearer t0k3n"}
    (tmp_path / "token").write_text("rotated")  # the kubelet rotates bound tokens
    assert sa.headers() == {"Authorization": "Bearer rotated"}


def test_outside_a_cluster_with_no_url_there_is_no_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert ServiceAccount.in_cluster(tmp_path, None) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    sa = ServiceAccount.in_cluster(tmp_path, None)
    assert sa is not None
    assert sa.api_url == "https://[fd00::1]:6443"


async def test_ready_endpoints_are_listed_then_followed(
    api: KubeApi, watching: Callable[..., EndpointSliceWatch]
) -> None:
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True, "10.0.0.2": False})
    api.set_endpoints(NS, "vllm-dflash", {"10.0.9.9": True})  # another Service's slice
    watch = watching()
    await until(lambda: watch.listed)
    assert watch.addresses() == {"10.0.0.1"}  # not ready: not a member
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True, "10.0.0.2": True})
    await until(lambda: watch.addresses() == {"10.0.0.1", "10.0.0.2"})
    # a second slice of the same Service adds to the first
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.3": True}, slice_name="vllm-plain-2")
    await until(lambda: watch.addresses() == {"10.0.0.1", "10.0.0.2", "10.0.0.3"})
    # a terminating pod is not ready: it leaves at once
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": False, "10.0.0.2": True})
    await until(lambda: watch.addresses() == {"10.0.0.2", "10.0.0.3"})
    api.delete_slice(NS, "vllm-plain-2")
    await until(lambda: watch.addresses() == {"10.0.0.2"})
    lists = [r for r in api.requests if "watch" not in r["query"]]
    assert len(lists) == 1  # one list, then only the watch
    assert lists[0]["query"]["labelSelector"] == "kubernetes.io/service-name=vllm-plain"
    assert all(r["token"] == f"Bearer {TOKEN}" for r in api.requests)
    assert watch.error is None


async def test_a_change_is_told_at_once(api: KubeApi, tmp_path: Path) -> None:
    changes: list[frozenset[str]] = []
    sa = account(api, tmp_path)
    async with sa.client() as client:
        watch = EndpointSliceWatch(client, sa, NS, "vllm-plain")
        watch.on_change = lambda: changes.append(watch.addresses())
        task = asyncio.create_task(watch.run())
        api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True})
        await until(lambda: bool(changes))
        api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True, "10.0.0.2": False})
        api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True, "10.0.0.2": True})
        await until(lambda: len(changes) >= 2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert changes[-1] == {"10.0.0.1", "10.0.0.2"}
    # a change that alters no ready address (10.0.0.2 joined not ready) is not told
    assert len(changes) == 2


async def test_an_ended_watch_resumes_where_it_was(
    api: KubeApi, watching: Callable[..., EndpointSliceWatch]
) -> None:
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True})
    watch = watching()
    await until(lambda: api.watches() == 1)
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True, "10.0.0.2": True})
    await until(lambda: len(watch.addresses()) == 2)
    version = watch.version
    api.end_watches()  # the server's watch timeout
    await until(lambda: api.watches() == 2)
    assert api.requests[-1]["query"]["resourceVersion"] == version
    assert sum("watch" not in r["query"] for r in api.requests) == 1  # no second list


async def test_bookmarks_move_the_version_on(
    api: KubeApi, watching: Callable[..., EndpointSliceWatch]
) -> None:
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True})
    watch = watching()
    await until(lambda: api.watches() == 1)
    assert api.requests[-1]["query"]["allowWatchBookmarks"] == "true"
    before = int(watch.version)
    api.bookmark()
    await until(lambda: int(watch.version) > before)
    assert watch.addresses() == {"10.0.0.1"}


async def test_a_version_too_old_lists_again(
    api: KubeApi, watching: Callable[..., EndpointSliceWatch]
) -> None:
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True})
    watch = watching()
    await until(lambda: api.watches() == 1)
    api.end_watches()
    api.compact()  # the history the watch would resume from is gone: 410 Expired
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.7": True})
    await until(lambda: watch.addresses() == {"10.0.0.7"})
    assert sum("watch" not in r["query"] for r in api.requests) == 2  # listed again
    assert watch.error is None


async def test_an_outage_keeps_the_last_addresses_and_says_why(
    api: KubeApi, watching: Callable[..., EndpointSliceWatch]
) -> None:
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True})
    watch = watching()
    await until(lambda: watch.listed and api.watches() == 1)
    api.fail(503)
    await until(lambda: watch.error is not None)
    assert "503" in watch.error  # type: ignore[operator]
    assert watch.addresses() == {"10.0.0.1"}
    api.fail(None)
    await until(lambda: watch.error is None)
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.2": True})
    await until(lambda: watch.addresses() == {"10.0.0.2"})


async def test_permissions_are_named_when_missing(
    api: KubeApi, tmp_path: Path, watching: Callable[..., EndpointSliceWatch]
) -> None:
    forbidden = watching(namespace="elsewhere")
    await until(lambda: forbidden.error is not None)
    assert "403 Forbidden" in forbidden.error  # type: ignore[operator]
    assert 'cannot list resource "endpointslices"' in forbidden.error  # type: ignore[operator]
    assert not forbidden.listed
    (elsewhere := tmp_path / "wrong").mkdir()
    sa = account(api, elsewhere, token="not-the-token")
    async with sa.client() as client:
        wrong = EndpointSliceWatch(client, sa, NS, "vllm-plain")
        task = asyncio.create_task(wrong.run())
        await until(lambda: wrong.error is not None)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert wrong.error is not None
    assert wrong.error.startswith("401 Unauthorized")


async def test_only_ip_slices_give_members(
    api: KubeApi, watching: Callable[..., EndpointSliceWatch]
) -> None:
    api.set_endpoints(NS, "vllm-plain", {"fd00::5": True}, address_type="IPv6")
    api.set_endpoints(
        NS, "vllm-plain", {"pod.example.test": True}, slice_name="fqdn", address_type="FQDN"
    )
    watch = watching()
    await until(lambda: watch.listed)
    assert watch.addresses() == {"fd00::5"}
