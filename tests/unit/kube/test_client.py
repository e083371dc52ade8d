"""The operator's and agents' ApiClient (`kube.client.api_client`): what it leaves out of
every request, and what it keeps."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import Configuration, V1ObjectMeta

from migpart.kube.client import api_client, env_proxy

SERVER = "https://10.0.0.1:6443"


def configuration() -> Configuration:
    cfg = Configuration()
    cfg.host = SERVER
    return cfg


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_requests_do_not_consult_the_environment_each_time() -> None:
    """No per-request look-up of ~/.netrc and the proxy variables (two worker-thread hops)."""
    async with api_client(configuration()) as client:
        assert client.rest_client.pool_manager.trust_env is False
        assert client.configuration.proxy is None


async def test_the_environments_proxy_is_still_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    async with api_client(configuration()) as client:
        assert client.configuration.proxy == "http://proxy.example:3128"
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    assert env_proxy(SERVER) is None


async def test_an_explicit_proxy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    cfg = configuration()
    cfg.proxy = "http://mine.example:8080"
    async with api_client(cfg) as client:
        assert client.configuration.proxy == "http://mine.example:8080"


async def test_plain_bodies_go_as_they_are_and_models_are_still_turned_into_json() -> None:
    body = {"metadata": {"name": "n1"}, "spec": {"gpus": [{"index": 0, "instances": []}]}}
    async with api_client(configuration()) as client:
        assert client.sanitize_for_serialization(body) is body
        meta = V1ObjectMeta(name="n1", labels={"a": "b"})
        assert client.sanitize_for_serialization(meta) == {"name": "n1", "labels": {"a": "b"}}
        assert client.sanitize_for_serialization([meta]) == [{"name": "n1", "labels": {"a": "b"}}]
