"""The process's one ApiClient: opened at startup from a kubeconfig or the pod's service
account, closed at cleanup. Everything in `migpart.kube` takes it as an argument.

`api_client` makes it, without two costs that kubernetes-asyncio adds to every request and
that showed in profiles of the operator at 1,000 nodes (a fifth of its CPU in a burst):

- its aiohttp session trusts the environment, so each request looks up `~/.netrc` and the
  proxy variables in a worker thread: two thread hops per request. The proxy is looked up once
  here instead (`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` still apply, as `Configuration.proxy`),
  and `.netrc` is not read (a Kubernetes client authenticates with a token or a certificate;
  a `.netrc` entry for the API server would only make aiohttp refuse the request);
- it copies every request body recursively to turn client model objects into JSON. migpart's
  bodies are plain JSON dicts already, and are passed through as they are.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException


@dataclass(frozen=True, slots=True)
class Credentials:
    """What kopf's own connection needs, taken from the same configuration as the ApiClient
    so that both talk to the same server as the same user."""

    server: str
    token: str | None
    ca_path: str | None
    certificate_path: str | None
    private_key_path: str | None
    insecure: bool


class KubeconfigError(Exception):
    """No usable client configuration: the message says which file and why, in one line."""


# What kubernetes-asyncio raises for a kubeconfig it cannot use: its own ConfigException, and
# whatever reading and parsing the file raise (a missing certificate file, YAML that is not a
# mapping, a context naming a missing cluster).
_CONFIG_ERRORS = (
    config.ConfigException,
    OSError,
    yaml.YAMLError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
)


async def load_configuration(kubeconfig: Path | None) -> Configuration:
    """A client configuration from `kubeconfig`, else $KUBECONFIG/~/.kube/config, else the
    in-cluster service account. Raises KubeconfigError when none of them is usable."""
    cfg = Configuration()
    if kubeconfig is not None:
        await _load_file(_existing(kubeconfig), cfg)
        return cfg
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cfg
    except config.ConfigException:
        pass
    await _load_file(_default_kubeconfig(), cfg, environ=True)
    return cfg


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise KubeconfigError(f"kubeconfig {path}: no such file")
    return path


def _default_kubeconfig() -> Path:
    """The first file $KUBECONFIG names, else ~/.kube/config; it must exist."""
    default = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "~/.kube/config"
    path = Path(default).expanduser()
    if not path.exists():
        raise KubeconfigError(
            "no kubeconfig: not running in a cluster, --kubeconfig not given, and "
            f"{default} does not exist"
            + ("" if "KUBECONFIG" in os.environ else " ($KUBECONFIG is not set)")
        )
    return path


async def _load_file(path: Path, cfg: Configuration, *, environ: bool = False) -> None:
    try:
        if environ:  # $KUBECONFIG may list several files; the library merges them
            await config.load_kube_config(client_configuration=cfg)
        else:
            await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    except _CONFIG_ERRORS as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise KubeconfigError(f"kubeconfig {path} is not usable: {reason}") from None


def credentials(cfg: Configuration) -> Credentials:
    token = cfg.api_key.get("BearerToken")
    if isinstance(token, str) and token.startswith("Bearer "):
        token = token.removeprefix("Bearer ")
    return Credentials(
        server=str(cfg.host),
        token=token if isinstance(token, str) else None,
        ca_path=cfg.ssl_ca_cert,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        insecure=not cfg.verify_ssl,
    )


class _PlainJsonClient(ApiClient):
    """An ApiClient that sends plain dict bodies as they are (module docstring)."""

    def sanitize_for_serialization(self, obj: Any) -> Any:
        if type(obj) is dict:
            return obj  # plain JSON: json.dumps (in the REST layer) takes it as it is
        return super().sanitize_for_serialization(obj)


def env_proxy(server: str) -> str | None:
    """The proxy the environment names for `server` (None: none, or NO_PROXY covers it)."""
    parts = urllib.parse.urlsplit(server)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def api_client(cfg: Configuration) -> ApiClient:
    """The ApiClient for `cfg` (module docstring). Call it with an event loop running."""
    if cfg.proxy is None:
        cfg.proxy = env_proxy(str(cfg.host))
    client = _PlainJsonClient(cfg)
    # aiohttp has no setter: the session is created (trusting the environment) by the client
    client.rest_client.pool_manager._trust_env = False
    return client


async def open_client(kubeconfig: Path | None) -> tuple[ApiClient, Credentials]:
    cfg = await load_configuration(kubeconfig)
    return api_client(cfg), credentials(cfg)


async def missing_resources(
    api: ApiClient, group: str, version: str, plurals: tuple[str, ...]
) -> list[str]:
    """Which of `plurals` in `group/version` the API server does not serve (yet), as
    `plural.group/version`. A CRD's resource is served once the CRD is Established."""
    try:
        found = await CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException as err:
        if err.status != 404:  # 404: not one resource of the group version is served
            raise
        served: set[str] = set()
    else:
        served = {r.name for r in found.resources}
    return [f"{p}.{group}/{version}" for p in plurals if p not in served]
