"""Field ownership: ``metadata.managedFields`` and server-side apply, a model of ``sigs.k8s.io/structured-merge-diff``.

Follows the server-side apply documentation (https://kubernetes.io/docs/reference/using-api/server-side-apply/):

* every field of an object is owned by the managers that set it: an **Apply** (``PATCH`` with
  ``application/apply-patch+yaml`` and a ``fieldManager``) owns exactly the fields of its configuration; an
  **Update** (create, ``PUT``, non-apply patches) takes the fields whose values it changed away from every
  other manager;
* an apply that would change a field another manager owns fails with ``409 Conflict`` naming manager and field
  (``Apply failed with 1 conflict: conflict with "<manager>": .spec.driver``; ``... using <apiVersion>`` when the
  owner's entry is an Update), each a cause of reason ``FieldManagerConflict``; ``force=true`` takes those fields
  over instead; applying the value a field already has makes the applier a co-owner, with no conflict;
* a field an applier applied before and leaves out of its next configuration is removed, unless another manager
  owns it;
* ``managedFields`` entries (``manager``, ``operation``, ``apiVersion``, ``time``, ``fieldsType: FieldsV1``,
  ``fieldsV1``, ``subresource``) in the ``FieldsV1`` encoding (``f:<field>``, ``k:<key json>`` for an item of a
  keyed list with ``.`` for the item itself, ``v:<value json>`` for a set's item);
* a non-apply write may reset the field ownership by sending ``managedFields: [{}]``; sending none (or the same
  as stored) keeps it.

Schema, simplified: objects are granular (each field tracked) except the structs the API marks
``+structType=atomic`` that the model lists; lists are atomic unless the model names them keyed lists
(``+listType=map``: ``metadata.ownerReferences`` by ``uid``, ``status.reservedFor`` by ``uid``,
``status.devices`` of claims by driver, pool, device and shareID) or sets (``metadata.finalizers``). Where the
real schema has a keyed list the model treats as atomic (e.g. a pod's containers), two managers of different
items conflict here where the real server would merge them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Managers", "Schema", "apply_config", "fieldset", "path_text"]

Path = tuple[str, ...]
_MISSING = object()
_PRESENT = object()
#: ``stripSet`` of the field manager: never owned by anyone.
_STRIPPED_META = frozenset(
    {
        "name",
        "namespace",
        "generateName",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    }
)


@dataclass(frozen=True)
class Schema:
    """Which parts of a kind are not granular maps: atomic structs, keyed lists (with their keys), sets."""

    atomic: frozenset[tuple[str, ...]] = frozenset()
    list_maps: Mapping[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    sets: frozenset[tuple[str, ...]] = frozenset()


def _key_element(item: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return "k:" + json.dumps({k: item[k] for k in keys if k in item}, sort_keys=True, separators=(",", ":"))


def _walk(value: Mapping[str, Any], pattern: tuple[str, ...], path: Path, schema: Schema, out: set[Path]) -> None:
    for key, child in value.items():
        if child is None:
            continue
        here, pat = (*path, "f:" + key), (*pattern, key)
        if pat in schema.atomic or not isinstance(child, (dict, list)) or not child:
            out.add(here)
        elif isinstance(child, dict):
            _walk(child, pat, here, schema, out)
        elif pat in schema.list_maps:
            for item in child:
                if isinstance(item, Mapping):
                    item_path = (*here, _key_element(item, schema.list_maps[pat]))
                    out.add(item_path)
                    _walk(item, pat, item_path, schema, out)
        elif pat in schema.sets:
            for item in child:
                out.add((*here, "v:" + json.dumps(item, sort_keys=True, separators=(",", ":"))))
        else:
            out.add(here)


def managed_part(obj: Mapping[str, Any], section: str | None) -> dict[str, Any]:
    """What field ownership covers: no apiVersion/kind, no server-set metadata; ``section`` keeps only that
    top-level field (``status`` on the status subresource) or, as ``"-status"``, drops it (the main resource of a
    kind with a status subresource: the strategy resets it)."""
    part = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in (part.get("metadata") or {}).items() if k not in _STRIPPED_META}
    part["metadata"] = meta
    if section == "-status":
        part.pop("status", None)
    elif section is not None:
        part = {section: part[section]} if section in part else {}
    return part


def fieldset(obj: Mapping[str, Any], schema: Schema, section: str | None = None) -> set[Path]:
    """The set of field paths ``obj`` sets (its leaves, keyed-list items, set items)."""
    out: set[Path] = set()
    _walk(managed_part(obj, section), (), (), schema, out)
    return out


def _find_item(items: list[Any], element: str) -> int:
    wanted = json.loads(element[2:])
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and all(item.get(k) == v for k, v in wanted.items()):
            return i
    return -1


def value_at(obj: Any, path: Path) -> Any:
    """The value at ``path`` (``_PRESENT`` for an item of a keyed list or set), ``_MISSING`` when absent."""
    current = obj
    for i, element in enumerate(path):
        last = i == len(path) - 1
        if element.startswith("f:"):
            if not isinstance(current, Mapping) or element[2:] not in current or current[element[2:]] is None:
                return _MISSING
            current = current[element[2:]]
        elif element.startswith("k:"):
            if not isinstance(current, list):
                return _MISSING
            index = _find_item(current, element)
            if index < 0:
                return _MISSING
            current = _PRESENT if last else current[index]
        else:  # v:
            if not isinstance(current, list) or json.loads(element[2:]) not in current:
                return _MISSING
            return _PRESENT
    return current


def _container(obj: dict[str, Any], path: Path, *, create: bool) -> Any:
    """The dict or list holding the last element of ``path`` (created on the way when ``create``)."""
    current: Any = obj
    for i, element in enumerate(path[:-1]):
        following = path[i + 1]
        if element.startswith("f:"):
            name = element[2:]
            if not isinstance(current.get(name), (dict, list)):
                if not create:
                    return None
                current[name] = [] if following[:2] in ("k:", "v:") else {}
            current = current[name]
        else:
            index = _find_item(current, element)
            if index < 0:
                if not create:
                    return None
                current.append(json.loads(element[2:]))
                index = len(current) - 1
            current = current[index]
    return current


def _order(obj: Any, path: Path) -> tuple[int, ...]:
    """Where ``path`` is in ``obj``: the index of each keyed item or set item on the way (0 for fields), so items
    an apply adds go in the order the applier wrote them."""
    out = []
    current = obj
    for element in path:
        if element.startswith("f:"):
            current = current.get(element[2:]) if isinstance(current, Mapping) else None
            out.append(0)
        elif isinstance(current, list):
            index = _find_item(current, element) if element.startswith("k:") else -1
            if element.startswith("v:") and json.loads(element[2:]) in current:
                index = current.index(json.loads(element[2:]))
            out.append(index)
            current = current[index] if element.startswith("k:") and index >= 0 else None
        else:
            out.append(0)
    return tuple(out)


def _set(obj: dict[str, Any], path: Path, value: Any) -> None:
    holder = _container(obj, path, create=True)
    last = path[-1]
    if last.startswith("f:"):
        holder[last[2:]] = copy.deepcopy(value)
    elif last.startswith("k:"):
        if _find_item(holder, last) < 0:
            holder.append(json.loads(last[2:]))
    elif json.loads(last[2:]) not in holder:
        holder.append(json.loads(last[2:]))


def _remove(obj: dict[str, Any], path: Path) -> None:
    holder = _container(obj, path, create=False)
    if holder is None:
        return
    last = path[-1]
    if last.startswith("f:"):
        holder.pop(last[2:], None)
    elif last.startswith("k:"):
        index = _find_item(holder, last)
        if index >= 0:
            del holder[index]
    elif json.loads(last[2:]) in holder:
        holder.remove(json.loads(last[2:]))


def path_text(path: Path) -> str:
    """A path as conflicts print it: ``.spec.driver``, ``.metadata.ownerReferences[uid="..."]``,
    ``.metadata.finalizers[="x"]``."""
    text = ""
    for element in path:
        if element.startswith("f:"):
            text += "." + element[2:]
        elif element.startswith("k:"):
            keys = json.loads(element[2:])
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
        else:
            text += f"[={element[2:]}]"
    return text


def _encode(paths: Iterable[Path]) -> dict[str, Any]:
    members = set(paths)
    tree: dict[str, Any] = {}
    for path in sorted(members):
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in members:  # a member with members below it is marked "."
        node = tree
        for element in path:
            node = node[element]
        if node and "." not in node:
            node["."] = {}
    return tree


def _decode(tree: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for element, child in tree.items():
        if element == ".":
            out.add(prefix)
            continue
        here = (*prefix, element)
        if child:
            out |= _decode(child, here)
        else:
            out.add(here)
    return out


@dataclass
class _Entry:
    manager: str
    operation: str
    api_version: str
    subresource: str
    time: str
    paths: set[Path]


class Managers:
    """The field managers of one object (``metadata.managedFields``), decoded."""

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries = entries

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None) -> Managers:
        entries = []
        for raw in ((obj or {}).get("metadata") or {}).get("managedFields") or []:
            if not isinstance(raw, Mapping) or not raw.get("manager"):
                continue
            entries.append(
                _Entry(
                    str(raw["manager"]),
                    str(raw.get("operation", "Update")),
                    str(raw.get("apiVersion", "")),
                    str(raw.get("subresource", "")),
                    str(raw.get("time", "")),
                    _decode(raw.get("fieldsV1") or {}),
                )
            )
        return cls(entries)

    def entry(self, manager: str, operation: str, subresource: str, api_version: str, now: str) -> _Entry:
        """The entry of ``manager``'s ``operation`` on ``subresource``: an applier has one whatever version it
        applies in (it names the last), an updater one per version (``BuildManagerIdentifier`` leaves the
        apiVersion out of an Apply entry's identity only)."""
        for entry in self.entries:
            if (entry.manager, entry.operation, entry.subresource) != (manager, operation, subresource):
                continue
            if operation == "Apply":
                entry.api_version = api_version
                return entry
            if entry.api_version == api_version:
                return entry
        entry = _Entry(manager, operation, api_version, subresource, now, set())
        self.entries.append(entry)
        return entry

    def describe(self, entry: _Entry) -> str:
        """``printManager``: the quoted name, ``with subresource``, and ``using <apiVersion>`` for an Update."""
        text = json.dumps(entry.manager)
        if entry.subresource:
            text += f" with subresource {json.dumps(entry.subresource)}"
        if entry.operation == "Update":
            text += f" using {entry.api_version}"
        return text

    def encoded(self) -> list[dict[str, Any]]:
        out = []
        for entry in self.entries:
            if not entry.paths:
                continue
            raw: dict[str, Any] = {
                "manager": entry.manager,
                "operation": entry.operation,
                "apiVersion": entry.api_version,
                "time": entry.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": _encode(entry.paths),
            }
            if entry.subresource:
                raw["subresource"] = entry.subresource
            out.append(raw)
        return out

    def track_update(
        self,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any],
        schema: Schema,
        section: str | None,
        who: tuple[str, str, str],
        now: str,
    ) -> None:
        """An Update by ``who`` (manager, apiVersion, subresource): it owns the fields it changed, others lose them;
        fields that are gone are nobody's."""
        now_fields = fieldset(new, schema, section)
        if old is None:
            changed = set(now_fields)
        else:
            before = fieldset(old, schema, section)
            changed = {
                p
                for p in now_fields
                if value_at(managed_part(old, section), p) != value_at(managed_part(new, section), p)
            }
            changed |= before - now_fields
        gone = changed - now_fields
        mine = self.entry(who[0], "Update", who[2], who[1], now)
        for entry in self.entries:
            entry.paths -= gone if entry is mine else changed
        if changed & now_fields:
            mine.paths |= changed & now_fields
            mine.time = now
        self.entries = [e for e in self.entries if e.paths or e is mine]


@dataclass
class Conflict:
    """One field another manager owns that an apply would change."""

    owner: str
    path: Path


def apply_config(
    live: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    managers: Managers,
    schema: Schema,
    section: str | None,
    who: tuple[str, str, str],
    force: bool,
    now: str,
) -> tuple[dict[str, Any], list[Conflict]]:
    """Merge ``config`` applied by ``who`` (manager, apiVersion, subresource) into ``live``.

    Returns the merged object and the conflicts; with conflicts (and no ``force``) nothing in ``managers`` changed.
    """
    new_fields = fieldset(config, schema, section)
    applier = managers.entry(who[0], "Apply", who[2], who[1], now)
    old_fields = set(applier.paths)
    others = [e for e in managers.entries if e is not applier]
    owned_by_others = set().union(*(e.paths for e in others)) if others else set()
    merged: dict[str, Any] = copy.deepcopy(dict(live)) if live is not None else {}
    applied = managed_part(config, section)
    for path in sorted(new_fields, key=lambda p: (len(p), _order(applied, p))):
        value = value_at(applied, path)
        keyed = tuple(e[2:] for e in path if e.startswith("f:"))
        if value == [] and (keyed in schema.list_maps or keyed in schema.sets) and value_at(merged, path) != _MISSING:
            continue  # an empty keyed list or set merges: the items others own stay (the applier owns the list)
        _set(merged, path, None if value is _PRESENT else value)
    keep = new_fields | owned_by_others
    dropped = {path for path in old_fields - keep if not any(p[: len(path)] == path for p in keep)}
    for path in sorted(dropped, key=len, reverse=True):
        # a keyed item goes whole: its fields (its keys among them) are not taken out one by one first, which
        # would leave the item unfindable by its key
        if not any(path[:i] in dropped for i in range(1, len(path))):
            _remove(merged, path)
    live_part = managed_part(live, section) if live is not None else {}
    merged_part = managed_part(merged, section)
    changed = {p for p in new_fields if value_at(live_part, p) != value_at(merged_part, p)}
    conflicts = [Conflict(managers.describe(e), p) for e in others for p in sorted(changed & e.paths)]
    if conflicts and not force:
        if not old_fields:
            managers.entries.remove(applier)
        return merged, conflicts
    for entry in others:
        entry.paths -= changed
    applier.time = now
    applier.paths = new_fields
    managers.entries = [e for e in managers.entries if e.paths]
    return merged, []
