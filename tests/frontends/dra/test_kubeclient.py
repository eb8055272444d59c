"""The DRA front end's API client: the pod's service account (HTTPS, CA, a token the kubelet rotates) or a
kubeconfig, against the API server stand-in over real HTTP(S) with the real lightkube client; errors naming what
is missing."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.kube.client import (
    KubeClientConfigError,
    cluster_config,
    describe_api_error,
    make_client,
)
from devplug.testing.apiserver import ApiServer

from .conftest import node, run, write_kubeconfig

TLS = Path(__file__).resolve().parents[2] / "fixtures" / "apiserver-tls"
TOKEN = "sa-token-1"


@pytest.fixture
def https_api() -> Iterator[ApiServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(TLS / "server.crt", TLS / "server.key")
    with ApiServer(tls=context, tokens={TOKEN}) as server:
        server.create("nodes", node())
        yield server


def service_account(root: Path, token: str = TOKEN, *, namespace: str = "devplug") -> Path:
    """A service account folder as the kubelet mounts it: token, ca.crt, namespace."""
    account = root / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token)
    shutil.copy(TLS / "ca.crt", account / "ca.crt")
    (account / "namespace").write_text(namespace)
    return account


def environ_of(api: ApiServer) -> dict[str, str]:
    host, port = api.url.removeprefix("https://").rsplit(":", 1)
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}


async def node_uid(client: Any) -> str:
    from lightkube.resources.core_v1 import Node

    try:
        found = await client.get(Node, "node-a")
        assert found.metadata is not None
        return str(found.metadata.uid)
    finally:
        await client.close()


def test_in_cluster_talks_https_with_the_service_accounts_token_and_ca(https_api: ApiServer, tmp_path: Path) -> None:
    account = service_account(tmp_path)
    config = cluster_config(service_account=account, environ=environ_of(https_api))
    assert config.cluster.server == https_api.url
    assert config.namespace == "devplug"
    client = make_client(
        field_manager="devplug-fpga.example.com", service_account=account, environ=environ_of(https_api)
    )
    assert run(lambda: node_uid(client)) == https_api.get("nodes", "node-a")["metadata"]["uid"]
    assert https_api.count(code=401) == 0


def test_in_cluster_reads_a_rotated_token_again_after_a_401(https_api: ApiServer, tmp_path: Path) -> None:
    account = service_account(tmp_path)
    client = make_client(field_manager="m", service_account=account, environ=environ_of(https_api))

    async def twice() -> tuple[str, str]:
        from lightkube.resources.core_v1 import Node

        try:
            first = await client.get(Node, "node-a")
            https_api.tokens = frozenset({"sa-token-2"})  # the kubelet rotated the projected token
            (account / "token").write_text("sa-token-2")
            second = await client.get(Node, "node-a")
            assert first.metadata is not None and second.metadata is not None
            return str(first.metadata.uid), str(second.metadata.uid)
        finally:
            await client.close()

    first, second = run(twice)
    assert first == second == https_api.get("nodes", "node-a")["metadata"]["uid"]
    assert https_api.count(code=401) == 1


def test_in_cluster_an_ipv6_service_host_is_bracketed(tmp_path: Path) -> None:
    account = service_account(tmp_path)
    config = cluster_config(
        service_account=account, environ={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert config.cluster.server == "https://[fd00::1]:443"


@pytest.mark.parametrize(
    ("environ", "missing"),
    [
        ({}, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT not set"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "KUBERNETES_SERVICE_PORT not set"),
        ({"KUBERNETES_SERVICE_PORT": "443"}, "KUBERNETES_SERVICE_HOST not set"),
    ],
)
def test_in_cluster_without_the_service_variables_names_them(
    tmp_path: Path, environ: dict[str, str], missing: str
) -> None:
    with pytest.raises(KubeClientConfigError, match=missing):
        cluster_config(service_account=service_account(tmp_path), environ=environ)


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("token", "token: no service account token: the pod mounts none"),
        ("ca.crt", "ca.crt: no cluster CA certificate: the pod mounts none"),
    ],
)
def test_in_cluster_a_missing_file_is_named(tmp_path: Path, broken: str, message: str) -> None:
    account = service_account(tmp_path)
    (account / broken).unlink()
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeClientConfigError, match=f"{account}/{message}"):
        cluster_config(service_account=account, environ=env)


def test_in_cluster_an_empty_token_and_a_ca_that_is_no_certificate_are_named(tmp_path: Path) -> None:
    account = service_account(tmp_path, token="  \n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeClientConfigError, match=f"{account}/token: the service account token is empty"):
        cluster_config(service_account=account, environ=env)
    (account / "token").write_text(TOKEN)
    (account / "ca.crt").write_text("not a certificate\n")
    with pytest.raises(KubeClientConfigError, match=f"^{account}: a certificate or key cannot be loaded"):
        make_client(field_manager="m", service_account=account, environ=env)


def test_a_kubeconfig_is_used_and_nothing_of_the_service_account_is_needed(api: ApiServer, tmp_path: Path) -> None:
    api.create("nodes", node())
    path = write_kubeconfig(api, tmp_path / "kubeconfig")
    client = make_client(path, field_manager="m", service_account=tmp_path / "none", environ={})
    assert run(lambda: node_uid(client)) == api.get("nodes", "node-a")["metadata"]["uid"]


def test_a_kubeconfig_with_a_relative_ca_and_a_token_file_talks_https(https_api: ApiServer, tmp_path: Path) -> None:
    import yaml  # type: ignore[import-untyped]

    folder = tmp_path / "kube"
    folder.mkdir()
    shutil.copy(TLS / "ca.crt", folder / "ca.crt")
    (folder / "token").write_text(TOKEN)
    (folder / "config").write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": https_api.url, "certificate-authority": "ca.crt"}}],
                "users": [{"name": "u", "user": {"tokenFile": str(folder / "token")}}],
                "contexts": [
                    {"name": "other", "context": {"cluster": "c"}},
                    {"name": "mine", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "other",
            }
        )
    )
    client = make_client(folder / "config", context="mine", field_manager="m")
    assert run(lambda: node_uid(client)) == https_api.get("nodes", "node-a")["metadata"]["uid"]
    assert https_api.count(code=401) == 0


def kubeconfig_text(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


@pytest.mark.parametrize(
    ("content", "context", "message"),
    [
        (None, None, "no such file"),
        ("clusters: [unclosed\n", None, "not YAML"),
        ("- a list\n", None, "not a kubeconfig"),
        (kubeconfig_text(clusters=None), None, "no clusters"),
        (kubeconfig_text(contexts=[]), None, "no contexts"),
        (kubeconfig_text(**{"current-context": None}), None, "no current-context, and the config names no context"),
        (kubeconfig_text(), "y", "no context 'y' \\(it has x\\)"),
        (
            kubeconfig_text(contexts=[{"name": "x", "context": {"cluster": "d", "user": "u"}}]),
            None,
            "context 'x' names cluster 'd', not there",
        ),
        (
            kubeconfig_text(contexts=[{"name": "x", "context": {"cluster": "c", "user": "v"}}]),
            None,
            "context 'x' names user 'v', not there",
        ),
        (kubeconfig_text(clusters=[{"name": "c", "cluster": {}}]), None, "cluster 'c' has no server"),
    ],
)
def test_a_broken_kubeconfig_is_named_with_what_is_wrong(
    tmp_path: Path, content: Any, context: str | None, message: str
) -> None:
    import yaml

    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    with pytest.raises(KubeClientConfigError, match=f"^kubeconfig {path}: {message}"):
        cluster_config(path, context=context)


def test_a_context_without_a_kubeconfig_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KubeClientConfigError, match="a kubeconfig context \\('x'\\) is given without a kubeconfig"):
        cluster_config(context="x", service_account=service_account(tmp_path), environ={})


def test_describe_api_error_gives_the_status_and_retry_after(api: ApiServer, kubeconfig: Path) -> None:
    from lightkube.resources.core_v1 import Node

    api.faults.fail(429, verb="get", retry_after=7)
    client = make_client(kubeconfig, field_manager="m")

    async def failed() -> Exception:
        try:
            await client.get(Node, "node-a")
        except Exception as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("the get did not fail")

    error = run(failed)
    assert describe_api_error(error) == ("429 TooManyRequests: Too many requests, please try again later.", 7.0)
    assert describe_api_error(ConnectionRefusedError(111, "refused")) == (
        "ConnectionRefusedError: [Errno 111] refused",
        None,
    )
