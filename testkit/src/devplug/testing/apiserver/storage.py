"""The API server's storage and verbs: one revision counter, a window of history, watches, field ownership.

Each behaviour follows the Kubernetes API concepts page (https://kubernetes.io/docs/reference/using-api/
api-concepts/, "Efficient detection of changes", "Resource versions", "Semantics for get and list", "Semantics
for watch", "410 Gone responses", "Unavailable resource versions", "Retrieving large results sets in chunks",
"Watch bookmarks") and the generic registry (``k8s.io/apiserver/pkg/registry/generic/registry/store.go``,
``pkg/storage/etcd3/store.go``, ``pkg/storage/cacher``):

* every write that changes an object takes the next revision (etcd's) as its ``metadata.resourceVersion``; an
  update that changes nothing is not written and keeps its resourceVersion (``GuaranteedUpdate`` compares the
  bytes);
* a window of history is kept (``history_limit`` events, or what :meth:`Storage.compact` left): a watch or an
  exact list from before it is ``410 Gone`` (reason ``Expired``);
* a list's ``metadata.resourceVersion`` is the revision it shows; ``limit``/``continue`` chunks show one
  snapshot; list options are validated as ``ValidateListOptions`` does (``422`` on ``ListOptions``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from devplug.testing.apiserver import validation, versions
from devplug.testing.apiserver.errors import ApiStatusError, FieldError, bad_request, invalid
from devplug.testing.apiserver.fields import Managers, apply_config, path_text
from devplug.testing.apiserver.patches import json_patch, merge_patch, strategic_as_merge
from devplug.testing.apiserver.resources import RESOURCES, Resource, by_kind
from devplug.testing.apiserver.selectors import FieldSelector, LabelSelector

__all__ = ["Event", "RequestRecord", "Storage", "WatchStream", "Writer"]

#: How long a read for a resourceVersion the server has not reached waits before ``504`` (the cacher's
#: ``blockTimeout``).
TOO_LARGE_WAIT_S = 3.0
#: The names ``names.SimpleNameGenerator`` appends to ``generateName`` (5 of these).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GC_MANAGER = "generic-garbage-collector"
APPLY_MEDIA = "application/apply-patch+yaml"
MERGE_MEDIA = "application/merge-patch+json"
JSON_PATCH_MEDIA = "application/json-patch+json"
STRATEGIC_MEDIA = "application/strategic-merge-patch+json"
_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without its resourceVersion and its managedFields' timestamps: what a no-op write leaves equal."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    if "managedFields" in meta:
        meta["managedFields"] = [{k: v for k, v in e.items() if k != "time"} for e in meta["managedFields"]]
    return {**obj, "metadata": meta}


def now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


_T = TypeVar("_T")


def _copy(obj: _T) -> _T:
    return copy.deepcopy(obj)


@dataclass(frozen=True)
class Event:
    """One change: what a watch sends (``obj``) and the object before it (``prev``)."""

    revision: int
    type: str
    resource: Resource
    namespace: str
    name: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request served: its verb (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``,
    ``delete``, ``deletecollection``), method, resource, namespace ('' for none), name, subresource, code, its query
    parameters (the last value of each), when it was answered (``time.monotonic()``) and its path. A discovery
    request (``/apis``, ``/version``, ...) is verb ``get`` of no resource (``""``)."""

    verb: str
    method: str
    resource: str
    namespace: str
    name: str | None
    subresource: str
    code: int
    query: Mapping[str, str] = field(default_factory=dict)
    time: float = field(default_factory=time.monotonic)
    #: The URL's path (``/apis/resource.k8s.io/v1beta1/resourceslices``): which version a request used.
    path: str = ""


@dataclass(frozen=True)
class Writer:
    """Who writes: the field manager, whether the write is a server-side dry run (``dryRun=All``), and the
    ``apiVersion`` the request was made in (None: the kind's stored one), which its ``managedFields`` entry names."""

    manager: str = "devplug-testing"
    dry_run: bool = False
    api_version: str | None = None

    def who(self, resource: Resource, subresource: str) -> tuple[str, str, str]:
        """(manager, apiVersion, subresource) of a ``managedFields`` entry."""
        return (self.manager, self.api_version or resource.api_version, subresource)


DEFAULT_WRITER = Writer()
SCHEDULER_WRITER = Writer("kube-scheduler")


def _not_found(resource: Resource, name: str) -> ApiStatusError:
    return ApiStatusError(
        404, "NotFound", f"{resource.describe(name)} not found", name, resource.group, resource.plural
    )


def _conflict(resource: Resource, name: str, why: str) -> ApiStatusError:
    return ApiStatusError(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {resource.describe(name)}: {why}",
        name,
        resource.group,
        resource.plural,
    )


_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def _list_options_invalid(errors: list[FieldError]) -> ApiStatusError:
    return invalid("ListOptions", "meta.k8s.io", "", "", errors)


def _encode_continue(revision: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if data.get("v") != "meta.k8s.io/v1":
            raise ValueError(
                "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
            )
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        detail = str(exc) if "continue key" in str(exc) else f"continue key is not valid: {exc}"
        raise bad_request(detail) from None


def _parse_rv(text: str) -> int:
    try:
        value = int(text)
        if value < 0:
            raise ValueError
        return value
    except ValueError:
        raise bad_request(
            f'resourceVersion: Invalid value: "{text}": strconv.ParseUint: parsing "{text}": invalid syntax'
        ) from None


class Storage:
    """All objects of every served kind, their history and the verbs on them; thread-safe.

    Tests may drive it in process as the scheduler, the kubelet or a controller would; every call takes the
    same path as the HTTP request that would do it (validation, strategy, field ownership, events).
    """

    def __init__(
        self,
        *,
        history_limit: int = 10_000,
        bookmark_interval: float = 60.0,
        disabled_features: Iterable[str] = (),
        release: versions.Release | None = None,
    ) -> None:
        self._lock = threading.RLock()
        #: The control-plane release modelled: a stored object holds only the fields its types have
        #: (:func:`devplug.testing.apiserver.versions.prune`).
        self.release = release or versions.RELEASES["1.36"]
        #: Feature gates turned off, as an API server of an older release or with ``--feature-gates=X=false`` has
        #: them: the kinds' strategies drop the fields they cover (``dropDisabledFields``). The gates modelled
        #: are :data:`devplug.testing.apiserver.versions.GATES`' (:mod:`devplug.testing.apiserver.gates`).
        self.disabled_features = frozenset(disabled_features)
        #: Notified on every write, bookmark request, watch closure and shutdown.
        self.changed = threading.Condition(self._lock)
        self.revision = 1
        #: Watches and exact lists from before this revision are 410 Gone.
        self.compacted = 1
        self.history_limit = history_limit
        #: Seconds between the bookmarks a watch with ``allowWatchBookmarks`` gets (the cacher's minute).
        self.bookmark_interval = bookmark_interval
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[Event] = []
        self.watch_epoch = 0
        self.abrupt_epoch = 0
        self.bookmark_epoch = 0
        self.closed = False
        #: Every HTTP request served, in order.
        self.requests: list[RequestRecord] = []
        self.gc_wanted = threading.Event()

    # --- the revision, history and events

    def _commit(
        self, resource: Resource, namespace: str, name: str, new: dict[str, Any] | None, writer: Writer
    ) -> dict[str, Any]:
        key = (resource.plural, namespace, name)
        prev = self._objects.get(key)
        if writer.dry_run:
            return _copy(new if new is not None else (prev or {}))
        self.revision += 1
        revision = str(self.revision)
        if new is None:
            assert prev is not None
            out = _copy(prev)
            out["metadata"]["resourceVersion"] = revision
            del self._objects[key]
            kind = "DELETED"
        else:
            new["metadata"]["resourceVersion"] = revision
            self._objects[key] = new
            out = _copy(new)
            kind = "ADDED" if prev is None else "MODIFIED"
        self._history.append(Event(self.revision, kind, resource, namespace, name, _copy(out), prev))
        if len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self.compacted = max(self.compacted, dropped.revision)
        self.changed.notify_all()
        self.gc_wanted.set()
        return out

    def compact(self, revision: int | None = None) -> int:
        """Forget history up to ``revision`` (default: now), as etcd's compaction and the watch cache's window do:
        watches and exact lists from before it answer 410 Gone. Returns the compacted revision."""
        with self._lock:
            target = self.revision if revision is None else min(revision, self.revision)
            self._history = [e for e in self._history if e.revision > target]
            self.compacted = max(self.compacted, target)
            return self.compacted

    def close_watches(self, *, abrupt: bool = False) -> None:
        """End every open watch now, as an API server restart or a watch timeout does: the stream ends cleanly
        (its last chunk), or with ``abrupt`` the connection is cut mid-stream."""
        with self._lock:
            self.watch_epoch += 1
            if abrupt:
                self.abrupt_epoch = self.watch_epoch
            self.changed.notify_all()

    def bookmark(self) -> None:
        """Send a BOOKMARK now to every watch that allowed them (the server may send one at any time)."""
        with self._lock:
            self.bookmark_epoch += 1
            self.changed.notify_all()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.changed.notify_all()
        self.gc_wanted.set()

    def _wait_for(self, revision: int) -> None:
        """Wait (up to the cacher's 3 s) for the store to reach ``revision``; ``504`` "Too large resource version"."""
        deadline = time.monotonic() + TOO_LARGE_WAIT_S
        while self.revision < revision:
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                raise ApiStatusError(
                    504,
                    "Timeout",
                    f"Too large resource version: {revision}, current: {self.revision}",
                    causes=[{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    retry_after=1,
                )
            self.changed.wait(left)

    def _state_at(self, resource: Resource, revision: int) -> dict[tuple[str, str, str], dict[str, Any]]:
        state = {k: v for k, v in self._objects.items() if k[0] == resource.plural}
        for event in reversed(self._history):
            if event.revision <= revision:
                break
            if event.resource is not resource:
                continue
            key = (resource.plural, event.namespace, event.name)
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.prev is not None:
                state[key] = event.prev
        return state

    # --- reads

    def get(self, resource: Resource, namespace: str, name: str, resource_version: str | None = None) -> dict[str, Any]:
        """``GET``: the object (``resourceVersion`` other than 0: not older than it, waiting up to 3 s)."""
        with self._lock:
            if resource_version not in (None, "", "0"):
                self._wait_for(_parse_rv(resource_version))
            found = self._objects.get((resource.plural, namespace, name))
            if found is None:
                raise _not_found(resource, name)
            return _copy(found)

    def objects(self, resource: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every stored object of ``resource`` (of ``namespace`` when given), for tests to inspect."""
        with self._lock:
            return [
                _copy(obj)
                for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == resource.plural and (namespace is None or ns == namespace)
            ]

    def list(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> dict[str, Any]:
        """``GET`` on a collection, with the semantics of the API concepts page's list table."""
        rv, match = resource_version or "", resource_version_match or ""
        errors = []
        if match:
            if not rv:
                errors.append(
                    FieldError(
                        "forbidden",
                        "resourceVersionMatch",
                        detail="resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if continue_token:
                errors.append(
                    FieldError(
                        "forbidden",
                        "resourceVersionMatch",
                        detail="resourceVersionMatch is forbidden when continue is provided",
                    )
                )
            if match not in ("Exact", "NotOlderThan"):
                errors.append(
                    FieldError(
                        "not_supported", "resourceVersionMatch", match, 'supported values: "Exact", "NotOlderThan", ""'
                    )
                )
            if match == "Exact" and rv == "0":
                errors.append(
                    FieldError(
                        "forbidden",
                        "resourceVersionMatch",
                        detail='resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        if errors:
            raise _list_options_invalid(errors)
        labels = LabelSelector(label_selector)
        fields = FieldSelector(field_selector, resource.selectable)
        limit = limit if limit and limit > 0 else None
        with self._lock:
            start = ""
            if continue_token:
                if rv not in ("", "0"):
                    raise bad_request("specifying resource version is not allowed when using continue")
                at, start = _decode_continue(continue_token)
                if at < 0:
                    at = self.revision
                elif at < self.compacted:
                    raise ApiStatusError(
                        410, "Expired", _CONTINUE_EXPIRED, extra_metadata={"continue": _encode_continue(-1, start)}
                    )
            elif rv == "":
                at = self.revision
            elif rv == "0":
                at, limit = self.revision, None  # served from the watch cache, which ignores limit
            else:
                wanted = _parse_rv(rv)
                exact = match == "Exact" or (limit is not None and not match)
                if exact and wanted < self.compacted:
                    raise ApiStatusError(410, "Expired", "The resourceVersion for the provided list is too old.")
                self._wait_for(wanted)
                at = wanted if exact else self.revision
            state = self._state_at(resource, at)
            selected = []
            keyed = sorted(
                ((f"{ns}/{name}" if resource.namespaced else name), ns, obj) for (_, ns, name), obj in state.items()
            )
            for key, ns, obj in keyed:
                if start and key < start:
                    continue
                if namespace not in (None, "") and ns != namespace:
                    continue
                if labels.matches((obj.get("metadata") or {}).get("labels")) and fields.matches(resource.fields(obj)):
                    selected.append((key, obj))
        meta: dict[str, Any] = {"resourceVersion": str(at)}
        if limit is not None and len(selected) > limit:
            meta["continue"] = _encode_continue(at, selected[limit - 1][0] + "\x00")
            if not label_selector and not field_selector:
                meta["remainingItemCount"] = len(selected) - limit
            selected = selected[:limit]
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": meta,
            "items": [_copy(obj) for _, obj in selected],
        }

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        allow_bookmarks: bool = False,
        send_initial_events: bool | None = None,
        timeout_s: float | None = None,
    ) -> WatchStream:
        """Open a watch (options checked now, as ``validateWatchOptions`` does; ``400`` for a bad selector)."""
        match = resource_version_match or ""
        errors = []
        if send_initial_events is not None and match != "NotOlderThan":
            errors.append(
                FieldError(
                    "forbidden",
                    "resourceVersionMatch",
                    detail="sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            )
        if match and send_initial_events is None:
            errors.append(
                FieldError(
                    "forbidden",
                    "resourceVersionMatch",
                    detail="resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                )
            )
        if match and match != "NotOlderThan":
            errors.append(
                FieldError("not_supported", "resourceVersionMatch", match, 'supported values: "NotOlderThan"')
            )
        if errors:
            raise _list_options_invalid(errors)
        rv = resource_version or ""
        if rv not in ("", "0"):
            wanted = _parse_rv(rv)
            if send_initial_events:
                with self._lock:
                    self._wait_for(wanted)
        return WatchStream(
            self,
            resource,
            namespace or None,
            LabelSelector(label_selector),
            FieldSelector(field_selector, resource.selectable),
            rv,
            allow_bookmarks,
            bool(send_initial_events),
            timeout_s,
        )

    # --- writes

    def _field_manager(self, old: Mapping[str, Any] | None, body: Mapping[str, Any]) -> Managers:
        sent = (body.get("metadata") or {}).get("managedFields")
        stored = ((old or {}).get("metadata") or {}).get("managedFields")
        if sent == [{}]:
            return Managers([])
        if sent is None or sent == stored:
            return Managers.of(old)
        return Managers.of(body)

    @staticmethod
    def _section(resource: Resource, subresource: str) -> str | None:
        if subresource == "status":
            return "status"
        return "-status" if "status" in resource.subresources else None

    def _namespace(self, name: str) -> dict[str, Any] | None:
        """The stored Namespace ``name`` (None when there is none), for the strategies that read one."""
        return self._objects.get(("namespaces", "", name))

    def _validate(self, resource: Resource, obj: dict[str, Any], old: dict[str, Any] | None, subresource: str) -> None:
        name = (obj.get("metadata") or {}).get("name") or ""
        errors = []
        if resource.authorize is not None:
            errors += resource.authorize(obj, old, subresource, self._namespace, self.disabled_features)
        if subresource == "status":
            errors += resource.validate_status(obj, old) if resource.validate_status is not None else []
        else:
            errors += validation.object_meta(obj) + resource.validate(obj, old)
        if old is not None and (old.get("metadata") or {}).get("deletionTimestamp"):
            added = set((obj.get("metadata") or {}).get("finalizers") or []) - set(
                (old.get("metadata") or {}).get("finalizers") or []
            )
            if added:
                errors.append(
                    FieldError(
                        "forbidden",
                        "metadata.finalizers",
                        detail="no new finalizers can be added if the object is being deleted, found new finalizers "
                        + json.dumps(sorted(added)),
                    )
                )
        if errors:
            raise invalid(resource.kind, resource.group, resource.plural, name, errors)

    def _check_body(self, resource: Resource, namespace: str, body: Mapping[str, Any], name: str | None) -> None:
        if not isinstance(body, Mapping):
            raise bad_request(f"the object provided is unrecognized (must be of type {resource.kind})")
        if body.get("kind") not in (None, "", resource.kind) or body.get("apiVersion") not in (
            None,
            "",
            resource.api_version,
        ):
            raise bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version "
                f"({resource.api_version})"
                if body.get("kind") in (None, "", resource.kind)
                else f"the object provided is unrecognized (must be of type {resource.kind}): {body.get('kind')}"
            )
        meta = body.get("metadata") or {}
        if resource.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        if name is not None and meta.get("name") not in (None, "", name):
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )

    def create(
        self, resource: Resource, namespace: str, body: Mapping[str, Any], writer: Writer = DEFAULT_WRITER
    ) -> dict[str, Any]:
        """``POST``: a new object (``generateName`` honoured); ``409 AlreadyExists`` when the name is taken."""
        self._check_body(resource, namespace, body, None)
        obj = _copy(dict(body))
        meta = obj.setdefault("metadata", {})
        if meta.get("resourceVersion"):
            raise ApiStatusError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            )
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        with self._lock:
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise invalid(
                        resource.kind,
                        resource.group,
                        resource.plural,
                        "",
                        [FieldError("required", "metadata.name", detail="name or generateName is required")],
                    )
                for _ in range(8):  # the server retries a taken generated name (RetryGenerateName)
                    meta["name"] = prefix[:58] + "".join(random.choice(_NAME_ALPHABET) for _ in range(5))
                    if (resource.plural, namespace, meta["name"]) not in self._objects:
                        break
            name = meta["name"]
            if resource.namespaced:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_text())
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink"):
                meta.pop(key, None)
            if resource.generation:
                meta["generation"] = 1
            if resource.status_on_create is not None:
                if resource.status_on_create:
                    obj["status"] = _copy(dict(resource.status_on_create))
                else:
                    obj.pop("status", None)
            self._strategy(resource, obj, None)
            self._validate(resource, obj, None, "")
            if (resource.plural, namespace, name) in self._objects:
                raise ApiStatusError(
                    409,
                    "AlreadyExists",
                    f"{resource.describe(name)} already exists",
                    name,
                    resource.group,
                    resource.plural,
                )
            managers = Managers([])
            managers.track_update(
                None, obj, resource.schema, self._section(resource, ""), writer.who(resource, ""), now_text()
            )
            meta["managedFields"] = managers.encoded()
            return self._commit(resource, namespace, name, obj, writer)

    def _strategy(self, resource: Resource, obj: dict[str, Any], old: Mapping[str, Any] | None) -> None:
        """The fields the release has (a 1.32 server's types have no device taints), the kind's defaulting, then its
        ``dropDisabledFields`` for the disabled feature gates."""
        if resource.group == versions.GROUP:
            versions.prune(resource.kind, self.release, obj)
        if resource.defaults is not None:
            resource.defaults(obj)
        if resource.drop_disabled is not None:
            resource.drop_disabled(obj, old, self.disabled_features)

    def _prepare_update(
        self, resource: Resource, old: dict[str, Any], body: Mapping[str, Any], subresource: str
    ) -> dict[str, Any]:
        new = _copy(dict(body))
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        kept = [
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ]
        if subresource == "status":
            kept += ["labels", "annotations", "finalizers", "ownerReferences"]
            for key in ("spec",):
                if key in old:
                    new[key] = _copy(old[key])
                else:
                    new.pop(key, None)
        elif "status" in resource.subresources:
            if "status" in old:
                new["status"] = _copy(old["status"])
            else:
                new.pop("status", None)
        for key in kept:
            if key in old_meta:
                meta[key] = _copy(old_meta[key])
            else:
                meta.pop(key, None)
        self._strategy(resource, new, old)
        if resource.generation and new.get("spec") != old.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        return new

    def _store_update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        old: dict[str, Any],
        new: dict[str, Any],
        managers: Managers,
        writer: Writer,
    ) -> dict[str, Any]:
        new["metadata"]["managedFields"] = managers.encoded()
        if not new["metadata"]["managedFields"]:
            new["metadata"].pop("managedFields")
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not self._graceful_pending(resource, new):
            return self._commit(resource, namespace, name, None, writer)
        if _comparable(old) == _comparable(new):
            # Nothing changed but, at most, the managedFields timestamps: the real apiserver keeps the old managed
            # fields and writes nothing (IgnoreManagedFieldsTimestampsTransformer, k8s.io/apiserver
            # pkg/endpoints/handlers/fieldmanager/equality.go), so the resourceVersion stays.
            return _copy(old)
        return self._commit(resource, namespace, name, new, writer)

    def update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        writer: Writer = DEFAULT_WRITER,
        subresource: str = "",
    ) -> dict[str, Any]:
        """``PUT``: optimistic on ``metadata.resourceVersion`` when it is sent (``409 Conflict`` when stale)."""
        self._check_body(resource, namespace, body, name)
        with self._lock:
            old = self._objects.get((resource.plural, namespace, name))
            if old is None:
                raise _not_found(resource, name)
            meta = body.get("metadata") or {}
            if (
                meta.get("resourceVersion") not in (None, "")
                and meta["resourceVersion"] != old["metadata"]["resourceVersion"]
            ):
                raise _conflict(resource, name, _MODIFIED)
            if meta.get("uid") not in (None, "") and meta["uid"] != old["metadata"]["uid"]:
                raise _conflict(
                    resource,
                    name,
                    f"Precondition failed: UID in precondition: {meta['uid']}, "
                    f"UID in object meta: {old['metadata']['uid']}",
                )
            new = self._prepare_update(resource, old, body, subresource)
            self._validate(resource, new, old, subresource)
            managers = self._field_manager(old, body)
            managers.track_update(
                old,
                new,
                resource.schema,
                self._section(resource, subresource),
                writer.who(resource, subresource),
                now_text(),
            )
            return self._store_update(resource, namespace, name, old, new, managers, writer)

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Any,
        content_type: str,
        writer: Writer = DEFAULT_WRITER,
        subresource: str = "",
        *,
        force: bool = False,
        view: tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[Any], Any]] | None = None,
    ) -> dict[str, Any]:
        """``PATCH``: server-side apply (:meth:`apply`), JSON merge patch, JSON patch, or a strategic merge patch
        that equals a merge patch; any other media type is ``415``. ``view``: (out, into) for a patch made in
        another version of the kind than the stored one: the patch applies to the object as ``out`` shows it, and
        ``into`` turns the result back into the stored form (as the real server converts to the request's version,
        patches, and converts back)."""
        media = content_type.split(";", maxsplit=1)[0].strip()
        if media == APPLY_MEDIA:
            return self.apply(resource, namespace, name, patch, writer, subresource, force=force)
        if force:
            raise invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                "",
                [FieldError("forbidden", "force", detail="may not be specified for non-apply patch")],
            )
        with self._lock:
            old = self._objects.get((resource.plural, namespace, name))
            if old is None:
                raise _not_found(resource, name)
            seen = view[0](old) if view is not None else old
            if media == MERGE_MEDIA:
                patched = merge_patch(seen, patch)
            elif media == JSON_PATCH_MEDIA:
                patched = json_patch(seen, patch)
            elif media == STRATEGIC_MEDIA:
                patched = strategic_as_merge(seen, patch)
            else:
                raise ApiStatusError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    f"{JSON_PATCH_MEDIA}, "
                    f"{MERGE_MEDIA}, {APPLY_MEDIA}, {STRATEGIC_MEDIA}",
                )
            if not isinstance(patched, dict):
                raise bad_request("the patched object is not an object")
            if view is not None:
                patched = view[1](patched)
            patched.setdefault("metadata", {})
            wanted = (patched["metadata"] or {}).get("resourceVersion")
            if wanted not in (None, "") and wanted != old["metadata"]["resourceVersion"]:
                raise _conflict(resource, name, _MODIFIED)
            patched["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self.update(resource, namespace, name, patched, writer, subresource)

    def apply(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        config: Any,
        writer: Writer,
        subresource: str = "",
        *,
        force: bool = False,
    ) -> dict[str, Any]:
        """Server-side apply: merge ``config`` as ``writer.manager``'s intent (creating the object when missing);
        ``409 Conflict`` naming each field another manager owns unless ``force``."""
        if not writer.manager:
            raise invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                "",
                [FieldError("required", "fieldManager", detail="is required for apply patch")],
            )
        if not isinstance(config, Mapping) or not config.get("apiVersion") or not config.get("kind"):
            raise bad_request("the apply configuration must be an object with apiVersion and kind set")
        self._check_body(resource, namespace, config, name)
        with self._lock:
            old = self._objects.get((resource.plural, namespace, name))
            wanted = (config.get("metadata") or {}).get("resourceVersion")
            if wanted not in (None, "") and (old is None or wanted != old["metadata"]["resourceVersion"]):
                raise _conflict(resource, name, _MODIFIED)
            managers = Managers.of(old)
            who = writer.who(resource, subresource)
            section = self._section(resource, subresource)
            merged, conflicts = apply_config(old, config, managers, resource.schema, section, who, force, now_text())
            if conflicts:
                if len(conflicts) == 1:
                    only = conflicts[0]
                    message = f"Apply failed with 1 conflict: conflict with {only.owner}: {path_text(only.path)}"
                else:
                    lines = []
                    for owner in sorted({c.owner for c in conflicts}):
                        lines.append(f"conflicts with {owner}:")
                        lines += [f"- {path_text(c.path)}" for c in conflicts if c.owner == owner]
                    message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
                raise ApiStatusError(
                    409,
                    "Conflict",
                    message,
                    causes=[
                        {
                            "reason": "FieldManagerConflict",
                            "message": f"conflict with {c.owner}",
                            "field": path_text(c.path),
                        }
                        for c in conflicts
                    ],
                )
            merged.setdefault("metadata", {})["name"] = name
            if old is None:
                if subresource:
                    raise _not_found(resource, name)
                if resource.status_on_create is not None:
                    merged.pop("status", None)
                return self._create_applied(resource, namespace, merged, managers, writer)
            new = self._prepare_update(resource, old, merged, subresource)
            self._validate(resource, new, old, subresource)
            return self._store_update(resource, namespace, name, old, new, managers, writer)

    def _create_applied(
        self, resource: Resource, namespace: str, obj: dict[str, Any], managers: Managers, writer: Writer
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        if resource.namespaced:
            meta["namespace"] = namespace
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_text())
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "generateName"):
            meta.pop(key, None)
        if resource.generation:
            meta["generation"] = 1
        if resource.status_on_create:
            obj["status"] = _copy(dict(resource.status_on_create))
        self._strategy(resource, obj, None)
        self._validate(resource, obj, None, "")
        meta["managedFields"] = managers.encoded()
        return self._commit(resource, namespace, meta["name"], obj, writer)

    @staticmethod
    def _graceful_pending(resource: Resource, obj: Mapping[str, Any]) -> bool:
        """A pod marked for graceful deletion stays until the kubelet's delete with grace 0."""
        return resource.plural == "pods" and bool((obj.get("metadata") or {}).get("deletionGracePeriodSeconds"))

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        options: Mapping[str, Any] | None = None,
        writer: Writer = DEFAULT_WRITER,
    ) -> dict[str, Any]:
        """``DELETE``: preconditions, graceful deletion of pods, finalizers, ``propagationPolicy`` (Background by
        default; Orphan and Foreground through their finalizers, finished by the garbage collector)."""
        options = options or {}
        preconditions = options.get("preconditions") or {}
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        if policy not in ("Background", "Orphan", "Foreground"):
            raise invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                "",
                [
                    FieldError(
                        "not_supported",
                        "propagationPolicy",
                        policy,
                        'supported values: "Foreground", "Background", "Orphan"',
                    )
                ],
            )
        with self._lock:
            old = self._objects.get((resource.plural, namespace, name))
            if old is None:
                raise _not_found(resource, name)
            meta = old["metadata"]
            for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = preconditions.get(key)
                if wanted is not None and wanted != meta[key]:
                    raise _conflict(
                        resource,
                        name,
                        f"Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {meta[key]}",
                    )
            new = _copy(old)
            new_meta = new["metadata"]
            grace = options.get("gracePeriodSeconds")
            if resource.plural == "pods":
                spec = old.get("spec") or {}
                grace = int(grace) if grace is not None else int(spec.get("terminationGracePeriodSeconds", 30))
                finished = (old.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                if grace > 0 and spec.get("nodeName") and not finished:
                    if "deletionTimestamp" not in new_meta:  # podStrategy.CheckGracefulDelete
                        new_meta["deletionTimestamp"] = now_text()
                        new_meta["deletionGracePeriodSeconds"] = grace
                        return self._commit(resource, namespace, name, new, writer)
                    return _copy(old)
                new_meta.pop("deletionGracePeriodSeconds", None)
            finalizers = list(new_meta.get("finalizers") or [])
            for wanted_finalizer, wanted_policy in (("orphan", "Orphan"), ("foregroundDeletion", "Foreground")):
                if policy == wanted_policy and wanted_finalizer not in finalizers:
                    finalizers.append(wanted_finalizer)
            if finalizers:
                new_meta["finalizers"] = finalizers
                if "deletionTimestamp" not in new_meta:
                    new_meta["deletionTimestamp"] = now_text()
                    new_meta["deletionGracePeriodSeconds"] = 0
                if new == old:
                    return _copy(old)
                return self._commit(resource, namespace, name, new, writer)
            deleted = self._commit(resource, namespace, name, None, writer)
        if resource.return_deleted_object:
            return deleted
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": resource.group, "kind": resource.plural, "uid": meta["uid"]},
        }

    def delete_collection(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
        options: Mapping[str, Any] | None = None,
        writer: Writer = DEFAULT_WRITER,
    ) -> dict[str, Any]:
        """``DELETE`` on a collection: each selected object deleted as :meth:`delete` would; the list of them."""
        listed = self.list(resource, namespace, label_selector=label_selector, field_selector=field_selector)
        deleted = []
        for item in listed["items"]:
            meta = item["metadata"]
            try:
                self.delete(resource, meta.get("namespace", ""), meta["name"], options, writer)
            except ApiStatusError as exc:
                if exc.code != 404:
                    raise
                continue
            deleted.append(item)
        return {**listed, "items": deleted}

    def bind(self, namespace: str, name: str, node: str, writer: Writer = SCHEDULER_WRITER) -> dict[str, Any]:
        """``POST pods/<name>/binding``: set ``spec.nodeName`` of an unbound pod (``409`` if bound already)."""
        pods = next(r for r in RESOURCES if r.plural == "pods")
        with self._lock:
            old = self._objects.get((pods.plural, namespace, name))
            if old is None:
                raise _not_found(pods, name)
            if (old.get("spec") or {}).get("nodeName"):
                raise _conflict(pods, name, f'pod {name} is already assigned to node "{old["spec"]["nodeName"]}"')
            new = _copy(old)
            new.setdefault("spec", {})["nodeName"] = node
            managers = Managers.of(old)
            managers.track_update(old, new, pods.schema, "-status", writer.who(pods, "binding"), now_text())
            return self._store_update(pods, namespace, name, old, new, managers, writer)

    # --- the garbage collector (kube-controller-manager's, pkg/controller/garbagecollector)

    def _owner_exists(self, dependent: Mapping[str, Any], ref: Mapping[str, Any]) -> bool:
        owner_resource = by_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
        if owner_resource is None:
            return True  # a kind the model does not serve: unresolvable, so left alone (as the GC does)
        namespace = (dependent.get("metadata") or {}).get("namespace", "") if owner_resource.namespaced else ""
        found = self._objects.get((owner_resource.plural, namespace, str(ref.get("name", ""))))
        return found is not None and found["metadata"]["uid"] == ref.get("uid")

    def collect_garbage(self) -> int:
        """One pass of the garbage collector; returns how many writes it made.

        * a dependent none of whose owners exists any more (no object of that kind and name with that uid) is
          deleted in the background; one with some owners gone loses those references (``attemptToDeleteItem``);
        * an owner being deleted with the ``orphan`` finalizer has the references to it removed from its
          dependents, then the finalizer; with ``foregroundDeletion`` its dependents are deleted first, then the
          finalizer (``processDeletingDependentsItem``).
        """
        writes = 0
        gc = Writer(_GC_MANAGER)
        with self._lock:
            snapshot = [(key, _copy(obj)) for key, obj in self._objects.items()]
        resources = {r.plural: r for r in RESOURCES}
        by_owner: dict[str, list[tuple[tuple[str, str, str], dict[str, Any]]]] = {}
        for key, obj in snapshot:
            for ref in obj["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(str(ref.get("uid")), []).append((key, obj))
        for (plural, namespace, name), obj in snapshot:
            resource = resources[plural]
            meta = obj["metadata"]
            finalizers = meta.get("finalizers") or []
            if not meta.get("deletionTimestamp"):
                continue
            dependents = by_owner.get(meta["uid"], [])
            if "orphan" in finalizers or "foregroundDeletion" in finalizers:
                done = True
                for (d_plural, d_ns, d_name), dep in dependents:
                    try:
                        if "orphan" in finalizers:
                            refs = [
                                r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") != meta["uid"]
                            ]
                            self.patch(
                                resources[d_plural],
                                d_ns,
                                d_name,
                                {"metadata": {"ownerReferences": refs or None}},
                                MERGE_MEDIA,
                                gc,
                            )
                        else:
                            self.delete(resources[d_plural], d_ns, d_name, None, gc)
                            done = False
                        writes += 1
                    except ApiStatusError:
                        done = False
                if done:
                    remaining = [f for f in finalizers if f not in ("orphan", "foregroundDeletion")]
                    try:
                        self.patch(
                            resource, namespace, name, {"metadata": {"finalizers": remaining or None}}, MERGE_MEDIA, gc
                        )
                        writes += 1
                    except ApiStatusError:
                        pass
        with self._lock:
            snapshot = [(key, _copy(obj)) for key, obj in self._objects.items()]
            verdicts = {
                key: [self._owner_exists(obj, ref) for ref in obj["metadata"].get("ownerReferences") or []]
                for key, obj in snapshot
            }
        for key, obj in snapshot:
            plural, namespace, name = key
            refs = obj["metadata"].get("ownerReferences") or []
            present = verdicts[key]
            if not refs or all(present) or obj["metadata"].get("deletionTimestamp"):
                continue
            try:
                if not any(present):
                    self.delete(
                        resources[plural], namespace, name, {"preconditions": {"uid": obj["metadata"]["uid"]}}, gc
                    )
                else:
                    kept = [r for r, ok in zip(refs, present, strict=True) if ok]
                    self.patch(
                        resources[plural], namespace, name, {"metadata": {"ownerReferences": kept}}, MERGE_MEDIA, gc
                    )
                writes += 1
            except ApiStatusError:
                continue
        return writes


@dataclass
class WatchStream:
    """One watch: its events as JSON-able dicts, from its start to its end (timeout, closure, shutdown).

    * no ``resourceVersion`` or ``0``: synthetic ADDED events of the current objects first ("Get State and
      Start at Most Recent/Any"); otherwise the changes after it ("Start at Exact"), or one ERROR event with a
      ``410`` ``Expired`` Status, ``too old resource version: <rv> (<oldest kept - 1>)``, when it is older than the
      window (the cacher answers 200 and that event, then ends the stream);
    * ``sendInitialEvents`` (with ``resourceVersionMatch=NotOlderThan``): the initial ADDED events, then a BOOKMARK
      annotated ``k8s.io/initial-events-end: "true"`` when bookmarks are allowed;
    * an object entering the selectors arrives as ADDED, one leaving them as DELETED (the object as before, with
      the event's resourceVersion: ``cacheWatcher.convertToWatchEvent``);
    * with ``allowWatchBookmarks``, a BOOKMARK (only ``metadata.resourceVersion`` set) every ``bookmark_interval``
      seconds, one 2 s before the watch's deadline (``timeoutSeconds``), and when :meth:`Storage.bookmark` asks:
      the cacher's schedule (``k8s.io/apiserver/pkg/storage/cacher``: ``cacheWatcher.nextBookmarkTime`` sends one
      "roughly every minute", ``defaultBookmarkFrequency = time.Minute`` in ``cacher.go``, and "2s before the
      deadline"; a watch whose deadline is less than 2 s away when it is scheduled gets none). Events do not move
      that schedule; the cacher's one-second buckets make it exact to about a second;
    * a watch that falls behind the window is ended (the cacher closes a watcher it cannot feed); resuming from
      its last resourceVersion then gets the 410.
    """

    storage: Storage
    resource: Resource
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    resource_version: str
    allow_bookmarks: bool
    send_initial_events: bool
    timeout_s: float | None
    #: Set when the stream ended because the connection is to be cut (``close_watches(abrupt=True)``).
    cut: bool = field(default=False, init=False)

    def _passes(self, obj: Mapping[str, Any] | None, namespace: str) -> bool:
        if obj is None or (self.namespace is not None and namespace != self.namespace):
            return False
        return self.labels.matches((obj.get("metadata") or {}).get("labels")) and self.fields.matches(
            self.resource.fields(obj)
        )

    def _convert(self, event: Event) -> dict[str, Any] | None:
        now_passes = self._passes(event.obj, event.namespace)
        before_passes = self._passes(event.prev, event.namespace)
        if event.type == "DELETED":
            return {"type": "DELETED", "object": _copy(event.obj)} if before_passes else None
        if now_passes and (event.type == "ADDED" or not before_passes):
            return {"type": "ADDED", "object": _copy(event.obj)}
        if now_passes:
            return {"type": "MODIFIED", "object": _copy(event.obj)}
        if before_passes and event.prev is not None:
            gone = _copy(event.prev)
            gone["metadata"]["resourceVersion"] = str(event.revision)
            return {"type": "DELETED", "object": gone}
        return None

    def _bookmark(self, revision: int, *, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(revision)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {
            "type": "BOOKMARK",
            "object": {"kind": self.resource.kind, "apiVersion": self.resource.api_version, "metadata": meta},
        }

    def _next_bookmark(self, now: float, deadline: float | None) -> float | None:
        """When the next periodic BOOKMARK is due (``nextBookmarkTime``): a ``bookmark_interval`` from now, or 2 s
        before the deadline when that is sooner; None when that moment has passed (no more)."""
        due = now + self.storage.bookmark_interval
        if deadline is not None:
            due = min(due, deadline - 2.0)
        return due if due >= now else None

    def events(self, stop: threading.Event) -> Iterator[dict[str, Any]]:
        """The stream's events; ends at the timeout, on :meth:`Storage.close_watches`, on ``stop`` or shutdown."""
        storage = self.storage
        deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
        batch: list[dict[str, Any]] = []
        with storage.changed:
            epoch, bookmarks = storage.watch_epoch, storage.bookmark_epoch
            initial = self.resource_version in ("", "0") or self.send_initial_events
            if initial:
                last = storage.revision
                for (_, ns, _), obj in sorted(storage._state_at(self.resource, last).items()):
                    if self._passes(obj, ns):
                        batch.append({"type": "ADDED", "object": _copy(obj)})
                if self.send_initial_events and self.allow_bookmarks:
                    batch.append(self._bookmark(last, initial_end=True))
            else:
                last = int(self.resource_version)
                if last < storage.compacted:
                    status = ApiStatusError(
                        410, "Expired", f"too old resource version: {last} ({storage.compacted})"
                    ).status()
                    batch.append({"type": "ERROR", "object": status})
                    last = -1
        yield from batch
        if last < 0:
            return
        next_bookmark = self._next_bookmark(time.monotonic(), deadline)
        while True:
            batch = []
            with storage.changed:
                while True:
                    if storage.closed or stop.is_set():
                        return
                    if storage.watch_epoch != epoch:
                        self.cut = storage.abrupt_epoch == storage.watch_epoch
                        return
                    if last < storage.compacted:
                        return  # fell behind the window: the watcher is closed
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        return
                    fresh = (
                        [e for e in storage._history if e.revision > last]
                        if storage._history and storage._history[-1].revision > last
                        else []
                    )
                    asked = storage.bookmark_epoch != bookmarks
                    due = self.allow_bookmarks and next_bookmark is not None and now >= next_bookmark
                    if fresh or (self.allow_bookmarks and asked) or due:
                        break
                    waits = [next_bookmark - now] if self.allow_bookmarks and next_bookmark is not None else []
                    if deadline is not None:
                        waits.append(deadline - now)
                    storage.changed.wait(min([1.0, *waits]))
                for event in fresh:
                    if event.resource is self.resource:
                        converted = self._convert(event)
                        if converted is not None:
                            batch.append(converted)
                if fresh:
                    last = fresh[-1].revision
                if self.allow_bookmarks and (asked or due):
                    batch.append(self._bookmark(storage.revision))
                    last = max(last, storage.revision)
                    if due:
                        next_bookmark = self._next_bookmark(time.monotonic(), deadline)
                bookmarks = storage.bookmark_epoch
            yield from batch
