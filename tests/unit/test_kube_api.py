"""The stand-in API server (tests/kube_api.py) read by the official Kubernetes Python client:
its list and watch answers parse into the client's own EndpointSlice types, so what the
discovery tests prove against it holds against what a real client expects."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client, watch  # type: ignore[import-untyped]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

from tests.kube_api import KubeApi

TOKEN = "official-client-token"
NS = "serving"
SELECTOR = "kubernetes.io/service-name=vllm-plain"


@pytest.fixture
def api() -> Iterator[KubeApi]:
    with KubeApi(TOKEN, {NS}) as server:
        yield server


def discovery_api(url: str, token: str = TOKEN) -> client.DiscoveryV1Api:
    config = client.Configuration(host=url, api_key={"authorization": token})
    config.api_key_prefix = {"authorization": "Bearer"}
    return client.DiscoveryV1Api(client.ApiClient(config))


def test_the_official_client_lists_and_watches_the_stand_in(api: KubeApi) -> None:
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.1": True, "10.0.0.2": False})
    v1 = discovery_api(api.url)
    listed = v1.list_namespaced_endpoint_slice(NS, label_selector=SELECTOR)
    assert listed.metadata.resource_version
    [item] = listed.items
    assert item.address_type == "IPv4"
    assert [(e.addresses, e.conditions.ready) for e in item.endpoints] == [
        (["10.0.0.1"], True),
        (["10.0.0.2"], False),
    ]
    api.set_endpoints(NS, "vllm-plain", {"10.0.0.2": True})
    api.delete_slice(NS, "vllm-plain-1")
    events = watch.Watch().stream(  # type: ignore[no-untyped-call]
        v1.list_namespaced_endpoint_slice,
        NS,
        label_selector=SELECTOR,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=1,
    )
    seen = [(e["type"], e["object"].metadata.name) for e in events]
    assert seen == [("MODIFIED", "vllm-plain-1"), ("DELETED", "vllm-plain-1")]


def test_the_official_client_reads_the_stand_in_errors(api: KubeApi) -> None:
    with pytest.raises(ApiException) as unauthorized:
        discovery_api(api.url, "wrong").list_namespaced_endpoint_slice(NS)
    assert unauthorized.value.status == 401
    with pytest.raises(ApiException) as forbidden:
        discovery_api(api.url).list_namespaced_endpoint_slice("elsewhere")
    assert forbidden.value.status == 403
    assert "Forbidden" in forbidden.value.body
    api.compact()
    with pytest.raises(ApiException) as expired:  # the client raises a 410 ERROR event
        for _ in watch.Watch().stream(  # type: ignore[no-untyped-call]
            discovery_api(api.url).list_namespaced_endpoint_slice,
            NS,
            resource_version="1",
            timeout_seconds=1,
        ):
            pass
    assert expired.value.status == 410
