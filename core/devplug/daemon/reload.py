"""Live reload (SIGHUP, ``devplug reload``): what a new config changes against the running one.

:func:`plan_reload` compares two checked configs resource by resource:

* a resource only in the new config is *added* (it starts);
* one only in the running config is *removed* (it drains, then is torn down);
* one whose table differs in anything (driver, options, ``health_interval``,
  ``hook_timeout``) is *changed* (it restarts on the new table, keeping its
  ledger: its state dir is keyed by the resource name);
* the rest is *unchanged* and keeps serving untouched (no new registration).

``[release]`` and ``[shutdown]`` apply live. The kubelet's paths and the state
dir cannot change under a running daemon (sockets, lock and ledgers live
there): a new config changing them is refused with a :class:`ConfigError`
naming the key, and the running config stays.

:class:`ReloadRecord` is what ``devplug status`` (and ``devplug reload``, which
waits for its ``attempts`` to move) shows about the loaded config and the last
reload.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devplug.config import Config, ResourceConfig
from devplug.errors import ConfigError

__all__ = ["FIXED_KEYS", "ReloadPlan", "ReloadRecord", "plan_reload"]

#: Settings a running daemon cannot take over: (the key as written in the config, how to read it).
FIXED_KEYS: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("kubelet.device_plugin_dir", lambda c: c.kubelet.device_plugin_dir),
    ("kubelet.pod_resources_socket", lambda c: c.kubelet.pod_resources_socket),
    ("state.dir", lambda c: c.state.dir),
)


@dataclass(frozen=True)
class ReloadPlan:
    """What applying a new config does, by resource name (each tuple sorted)."""

    added: tuple[ResourceConfig, ...]
    changed: tuple[ResourceConfig, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]

    def describe(self) -> str:
        """One line for the log: ``added a, b; changed c; removed -; unchanged d``."""
        parts = [
            ("added", [rc.name for rc in self.added]),
            ("changed", [rc.name for rc in self.changed]),
            ("removed", list(self.removed)),
            ("unchanged", list(self.unchanged)),
        ]
        return "; ".join(f"{what} {', '.join(names) or '-'}" for what, names in parts)


def plan_reload(running: Config, new: Config) -> ReloadPlan:
    """Compare ``new`` with the ``running`` config; :class:`ConfigError` if it changes a setting that cannot
    change live (:data:`FIXED_KEYS`), naming the file and key."""
    source = str(new.path) if new.path is not None else "<config>"
    for key, read in FIXED_KEYS:
        before, after = read(running), read(new)
        if before != after:
            raise ConfigError(
                f"{source}: {key}: changed from {before} to {after}, which a running daemon cannot apply "
                "(its sockets, lock and ledgers live there); restart the daemon for it, or put the old value back"
            )
    old = {rc.name: rc for rc in running.resources}
    now = {rc.name: rc for rc in new.resources}
    return ReloadPlan(
        added=tuple(now[n] for n in sorted(now.keys() - old.keys())),
        changed=tuple(now[n] for n in sorted(now.keys() & old.keys()) if now[n] != old[n]),
        removed=tuple(sorted(old.keys() - now.keys())),
        unchanged=tuple(n for n in sorted(now.keys() & old.keys()) if now[n] == old[n]),
    )


@dataclass
class ReloadRecord:
    """The loaded config's generation and the last reload's outcome, as the status file shows them."""

    #: 1 for the config the daemon started with, one more for each reload applied.
    generation: int = 1
    loaded_at: float = field(default_factory=time.time)
    #: Reloads asked for (SIGHUP) and handled, applied or refused.
    attempts: int = 0
    last_at: float | None = None
    #: ``"ok"`` (applied) or ``"refused"`` (the running config stayed), None before the first reload.
    last_result: str | None = None
    last_error: str | None = None
    last_plan: ReloadPlan | None = None

    def applied(self, plan: ReloadPlan) -> None:
        self.attempts += 1
        self.generation += 1
        self.loaded_at = self.last_at = time.time()
        self.last_result, self.last_error, self.last_plan = "ok", None, plan

    def refused(self, reason: str) -> None:
        self.attempts += 1
        self.last_at = time.time()
        self.last_result, self.last_error, self.last_plan = "refused", reason, None

    def describe(self) -> dict[str, Any]:
        plan = self.last_plan
        return {
            "generation": self.generation,
            "loaded_at": self.loaded_at,
            "attempts": self.attempts,
            "last_at": self.last_at,
            "last_result": self.last_result,
            "last_error": self.last_error,
            "added": [rc.name for rc in plan.added] if plan else [],
            "changed": [rc.name for rc in plan.changed] if plan else [],
            "removed": list(plan.removed) if plan else [],
            "unchanged": list(plan.unchanged) if plan else [],
        }
