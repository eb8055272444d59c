"""How the node's kubelet keys registered DRA plugins: by driver name, or by endpoint. Learnt before registering.

Two rules are in the field:

* **by name** (Kubernetes up to 1.32; ``pkg/kubelet/cm/dra/plugin/plugins_store.go`` and ``registration.go`` of
  v1.32): the kubelet keeps one plugin per driver name. A registration replaces the plugin registered under the
  name ("DRA plugin already registered, the old plugin was replaced"); ``DeRegisterPlugin(pluginName)`` deletes
  *whatever* is registered under the name and wipes the node's ResourceSlices of the driver at once. So when an
  old instance's registration socket goes after a new instance registered, the kubelet drops the *new* one; and a
  dead instance's socket removed just before a new one registers races the new registration.
* **by endpoint** (from 1.33, PR #129832 "DRA kubelet: support rolling upgrades"): several instances per driver;
  ``DeRegisterPlugin(pluginName, endpoint)`` removes that instance only, and the slices are wiped only when no
  instance is left, after ``wipingDelay`` (30 s), cancelled when one registers.

Where it is learnt (:func:`learn_rule`): the Node's ``status.nodeInfo.kubeletVersion``, which the kubelet writes
and DRA's RBAC already lets the daemon read (``nodes: get``). A kubelet that opens a ``NodeWatchResources``
stream (the DRA health API, 1.34 and later) keys by endpoint whatever the Node says
(:meth:`KubeletRule.seen_health_stream`).
A version that cannot be read or parsed leaves the rule :attr:`PluginKeying.UNKNOWN`, which devplug treats as by
name: the cautious rule costs a re-registration (about a second without the driver) where the other would cost
the driver.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devplug.kube.client import describe_api_error

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["FIRST_BY_ENDPOINT", "LEARN_TIMEOUT_S", "KubeletRule", "PluginKeying", "keying_of", "learn_rule"]

log = logging.getLogger("devplug.frontends.dra")

#: The first kubelet release keeping several instances of a DRA driver, keyed by endpoint (PR #129832).
FIRST_BY_ENDPOINT = (1, 33)
#: How long reading the Node may take at start before the rule is left unknown.
LEARN_TIMEOUT_S = 5.0

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


class PluginKeying(enum.Enum):
    """How the kubelet keys registered DRA plugins."""

    BY_NAME = "by-name"
    BY_ENDPOINT = "by-endpoint"
    UNKNOWN = "unknown"


def keying_of(kubelet_version: str) -> PluginKeying:
    """The rule of a kubelet reporting ``kubelet_version`` (``v1.32.9``, ``v1.33.1+k3s1``, ``v1.31.4-eks-1a2b``)."""
    found = _VERSION.match(kubelet_version.strip())
    if found is None:
        return PluginKeying.UNKNOWN
    release = (int(found.group(1)), int(found.group(2)))
    return PluginKeying.BY_ENDPOINT if release >= FIRST_BY_ENDPOINT else PluginKeying.BY_NAME


@dataclass
class KubeletRule:
    """What devplug knows of the kubelet's rule, and from where (for ``devplug status``)."""

    keying: PluginKeying = PluginKeying.UNKNOWN
    kubelet_version: str = ""
    learnt_from: str = "nothing yet"

    @property
    def by_name(self) -> bool:
        """True unless the kubelet is known to key by endpoint (an unknown kubelet is treated as keying by name)."""
        return self.keying is not PluginKeying.BY_ENDPOINT

    def seen_health_stream(self) -> None:
        """The kubelet opened ``NodeWatchResources``: it is 1.34 or later, so it keys plugins by endpoint."""
        if self.keying is PluginKeying.BY_ENDPOINT:
            return
        log.info(
            "the kubelet opened a DRA health stream (1.34 or later): it keys DRA plugins by endpoint (was: %s, %s)",
            self.keying.value,
            self.learnt_from,
        )
        self.keying = PluginKeying.BY_ENDPOINT
        self.learnt_from = "the kubelet opened NodeWatchResources (the DRA health API is 1.34's)"

    def describe(self) -> dict[str, Any]:
        return {
            "kubelet_version": self.kubelet_version or None,
            "plugin_keying": self.keying.value,
            "learnt_from": self.learnt_from,
        }


async def learn_rule(client: AsyncClient, node: str, timeout: float = LEARN_TIMEOUT_S) -> KubeletRule:
    """The rule of ``node``'s kubelet from its Node object (see the module's docstring); never raises: what went
    wrong is said in :attr:`KubeletRule.learnt_from` and the log."""
    try:
        found = await asyncio.wait_for(_node_json(client, node), timeout)
    except Exception as exc:  # an API error, a timeout, the transport's (httpx's vary): any leaves the rule unknown
        why = f"reading Node {node} failed: {describe_api_error(exc)[0]}"
    else:
        info = (found.get("status") or {}).get("nodeInfo") or {}
        version = str(info.get("kubeletVersion") or "")
        keying = keying_of(version)
        if keying is PluginKeying.UNKNOWN:
            why = f"Node {node} reports kubelet version {version!r}, which is not a Kubernetes version"
        else:
            rule = KubeletRule(keying, version, f"Node {node} status.nodeInfo.kubeletVersion")
            log.info("the kubelet of %s is %s: it keys DRA plugins %s", node, version, keying.value.replace("-", " "))
            return rule
    log.warning(
        "%s; treating the kubelet as keying DRA plugins by name (1.32's rule): a handover or restart then "
        "registers this instance again once the old instance's socket is gone",
        why,
    )
    return KubeletRule(PluginKeying.UNKNOWN, "", why)


async def _node_json(client: AsyncClient, node: str) -> dict[str, Any]:
    """The Node as the API server gives it (lightkube's Node model insists on every ``nodeInfo`` field, which only
    the version is needed of): the client's own request, transport and credentials, decoded as JSON."""
    from lightkube.resources.core_v1 import Node

    generic = client._client
    request = generic.prepare_request("get", Node, name=node)
    answer = await generic.send(generic.build_adapter_request(request))  # type: ignore[no-untyped-call]
    generic.raise_for_status(answer)  # type: ignore[no-untyped-call]
    found = answer.json()
    return found if isinstance(found, dict) else {}
