"""The daemon's per-node profiles: the node's labels, the profiles they choose, and their application through the
live reload.

At start (:meth:`NodeProfiles.start`) the Node is read once, within :data:`INITIAL_READ_S`, so the daemon starts on
the config its labels choose; when it cannot be read (no node name, no client library, no credentials, the API
server unreachable) the daemon starts on the base config and says so (log and status), and keeps trying.
Afterwards (:meth:`NodeProfiles.begin`) the Node is watched (:class:`~devplug.profiles.nodewatch.NodeWatch`); when
its labels choose other profiles (or now make an error: an unknown name, profiles that conflict), a reload is
requested. A reload -- that one, SIGHUP or ``devplug reload`` -- reads the config file and calls
:meth:`NodeProfiles.compose`, which applies the node's last labels to it: the profiles chosen are merged in, or
the reload is refused with the reason (the running config keeps serving), exactly as a bad config file is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devplug.config import Config
from devplug.config.dra import NODE_NAME_ENV
from devplug.config.profiles import PROFILE_LABEL
from devplug.errors import ConfigError
from devplug.profiles.compose import compose
from devplug.profiles.nodewatch import NodeWatch
from devplug.profiles.select import Selection, select

__all__ = ["INITIAL_READ_S", "NodeProfiles", "node_client"]

log = logging.getLogger("devplug.profiles")

#: How long the daemon's start waits for the first read of its Node before starting on the base config.
INITIAL_READ_S = 5.0
#: The field manager of the profiles' client (it only reads; the API server wants one for any write).
FIELD_MANAGER = "devplug-profiles"


def node_client(kubeconfig: Path | None) -> tuple[Any, str | None]:
    """A client of the API server (:func:`devplug.kube.client.make_client`) and None, or None and why there is none
    (no client library, no credentials)."""
    try:
        from devplug.kube.client import KubeClientConfigError, make_client

        return make_client(kubeconfig, field_manager=FIELD_MANAGER), None
    except ImportError as exc:
        return None, f"the Kubernetes client library is not installed ({exc.name}); pip install 'devplug[kubernetes]'"
    except KubeClientConfigError as exc:
        return None, f"no API server credentials: {exc}"


class NodeProfiles:
    """Chooses the node's profiles from its labels and has them applied (see the module)."""

    def __init__(self, config: Config) -> None:
        self.node = config.node
        self._kubeconfig = config.kubernetes.kubeconfig
        self._running: Callable[[], Config] = lambda: config
        #: The node's labels last read (None: never read, so the base config runs).
        self.labels: dict[str, str] | None = None
        #: Why the API cannot be used at all (no name, library or credentials), or None.
        self.unavailable: str | None = None
        self.watch: NodeWatch | None = None
        self._client: Any = None
        #: What the last labels choose: (profile names, None) or ((), the error).
        self._wanted: tuple[tuple[str, ...], str | None] | None = None
        #: The selection of the config last composed (applied once the reload applies it).
        self._pending: Selection | None = None
        #: The selection the running config was composed with.
        self.active = Selection()
        #: Why the node's labels could not be applied (the running config stays), or None.
        self.refused: str | None = None
        self._request_reload: Callable[[str], None] | None = None
        self._task: asyncio.Future[None] | None = None

    # --- start and stop

    async def start(self, config: Config) -> Config:
        """Read the Node once (bounded by :data:`INITIAL_READ_S`); the config to start on: ``config`` with the
        profiles its labels choose, or ``config`` itself when they cannot be read or applied (said in the log)."""
        if not self.node.name:
            self.unavailable = (
                f"the node's name is unknown: set [node] name, or {NODE_NAME_ENV} from the downward API's spec.nodeName"
            )
        else:
            self._client, self.unavailable = node_client(self._kubeconfig)
        if self.unavailable is not None:
            log.warning("profiles: no access to the node's labels (%s): serving the base config", self.unavailable)
            return config
        self.watch = NodeWatch(self._client, self.node.name, self._labels_seen)
        try:
            await asyncio.wait_for(self.watch.read(), INITIAL_READ_S)
        except Exception as exc:  # unreachable, refused, timed out: the watch keeps trying once the daemon runs
            self.watch.state, self.watch.detail = "retrying", f"{type(exc).__name__}: {exc}"
            log.warning(
                "profiles: cannot read node %s (%s): serving the base config until it can be read",
                self.node.name,
                self.watch.detail,
            )
            return config
        try:
            composed = self.compose(config)
        except ConfigError as exc:
            log.error("profiles: the node's labels cannot be applied, serving the base config: %s", exc)
            return config
        self.applied(composed)
        log.info("profiles: node %s runs %s", self.node.name, self.active.describe())
        return composed

    def begin(self, running: Callable[[], Config], request_reload: Callable[[str], None]) -> None:
        """Watch the Node from now on (on the running loop): a change of the profiles its labels choose calls
        ``request_reload`` with the reason; ``running`` gives the config running now."""
        self._running = running
        self._request_reload = request_reload
        if self.watch is not None and self._task is None:
            self._task = asyncio.ensure_future(self.watch.run())
            self._task.add_done_callback(self._watch_ended)

    def _watch_ended(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # NodeWatch.run retries everything: a bug
            log.error("profiles: the watch of node %s died", self.node.name, exc_info=task.exception())
            if self.watch is not None:
                self.watch.state, self.watch.detail = "failed", repr(task.exception())

    async def close(self) -> None:
        """Stop watching and close the client."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    # --- labels in, configs out

    def _labels_seen(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)
        try:
            wanted: tuple[tuple[str, ...], str | None] = (select(self._running().profiles, labels).names, None)
        except ConfigError as exc:
            wanted = ((), str(exc))
        if wanted == self._wanted:
            return
        self._wanted = wanted
        if self._request_reload is not None:
            log.info(
                "profiles: node %s's labels now choose %s",
                self.node.name,
                ", ".join(wanted[0]) or "no profile" if wanted[1] is None else f"what cannot apply ({wanted[1]})",
            )
            self._request_reload(f"node {self.node.name}'s labels changed")

    def compose(self, loaded: Config) -> Config:
        """``loaded`` (a config just read from the file) with the profiles the node's last labels choose;
        :class:`ConfigError` (kept in :attr:`refused`) when they name an unknown profile, conflict, or make an
        invalid config. Without labels (never read) the base config itself."""
        if self.labels is None:
            self._pending = Selection()
            return loaded
        try:
            selection = select(loaded.profiles, self.labels)
            composed = compose(loaded, selection.names)
        except ConfigError as exc:
            self.refused = str(exc)
            raise
        self.refused = None
        self._pending = selection
        return composed

    def applied(self, config: Config) -> None:
        """``config`` runs now (started, or applied by a reload)."""
        pending = self._pending
        self.active = pending if pending is not None and pending.names == config.applied else Selection()

    # --- what status shows

    def describe(self, running: Config) -> dict[str, Any]:
        """The node, where its labels come from, the profiles running and why, what was refused."""
        watch = self.watch
        if self.unavailable is not None:
            api, detail = "unavailable", self.unavailable
        elif watch is not None:
            api, detail = watch.state, watch.detail
        else:
            api, detail = "unavailable", "not started"
        reasons = dict(self.active.reasons)
        return {
            "node": self.node.name or None,
            "node_source": self.node.source or None,
            "api": api,
            "api_detail": detail,
            "resource_version": watch.resource_version if watch is not None else "",
            "labels_read": self.labels is not None,
            "label": (self.labels or {}).get(PROFILE_LABEL),
            "defined": list(running.profiles.names()),
            "active": list(running.applied),
            "reasons": {name: reasons.get(name, "") for name in running.applied},
            "refused": self.refused,
        }
