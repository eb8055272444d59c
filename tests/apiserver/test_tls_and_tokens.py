"""The stand-in over HTTPS with bearer tokens: what a client's in-cluster credentials (a CA, a token file) meet."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from devplug.testing.apiserver import ApiServer

from .conftest import node

TLS = Path(__file__).resolve().parents[1] / "fixtures" / "apiserver-tls"


def server_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(TLS / "server.crt", TLS / "server.key")
    return context


def client_of(api: ApiServer, user: dict[str, Any], ca: Path | None) -> Any:
    import httpx2
    from lightkube import Client, KubeConfig

    cluster: dict[str, Any] = {"server": api.url}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }
    )
    return Client(config, timeout=httpx2.Timeout(10.0), trust_env=False)


def test_https_with_a_known_bearer_token_is_served_and_others_are_401(tmp_path: Path) -> None:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node

    with ApiServer(tls=server_context(), tokens={"good"}) as api:
        assert api.url.startswith("https://127.0.0.1:")
        api.create("nodes", node())
        client = client_of(api, {"token": "good"}, TLS / "ca.crt")
        assert client.get(Node, "node-a").metadata.name == "node-a"
        for user in ({"token": "bad"}, {}):
            with pytest.raises(ApiError) as refused:
                client_of(api, user, TLS / "ca.crt").get(Node, "node-a")
            status = refused.value.status
            assert (status.code, status.reason, status.message) == (401, "Unauthorized", "Unauthorized")
        assert api.count(code=401) == 2
        assert api.count(verb="get", resource="nodes", code=200) == 1


def test_a_client_that_does_not_trust_the_ca_fails_the_handshake_and_the_server_serves_on() -> None:
    import httpx2
    from lightkube.resources.core_v1 import Node

    with ApiServer(tls=server_context()) as api:
        api.create("nodes", node())
        with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            client_of(api, {}, None).get(Node, "node-a")
        assert client_of(api, {}, TLS / "ca.crt").get(Node, "node-a").metadata.name == "node-a"


def test_a_rotated_token_file_is_read_again_after_a_401(tmp_path: Path) -> None:
    from lightkube.resources.core_v1 import Node

    token = tmp_path / "token"
    token.write_text("first\n")
    with ApiServer(tls=server_context(), tokens={"first"}) as api:
        api.create("nodes", node())
        client = client_of(api, {"tokenFile": str(token)}, TLS / "ca.crt")
        assert client.get(Node, "node-a").metadata.name == "node-a"
        api.tokens = frozenset({"second"})
        token.write_text("second\n")
        assert client.get(Node, "node-a").metadata.name == "node-a"
        assert api.count(code=401) == 1  # the old token was refused once, then the file was read again
