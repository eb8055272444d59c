"""The non-apply patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic merge patch
where it equals a merge patch.

The API server accepts ``application/merge-patch+json``, ``application/json-patch+json``,
``application/strategic-merge-patch+json`` (built-in kinds) and ``application/apply-patch+yaml``
(``k8s.io/apiserver/pkg/endpoints/handlers/patch.go``). A strategic merge patch differs from a merge patch on
lists with a patch merge key and on ``$patch`` directives; the model accepts one only when it contains neither a
list nor a ``$`` directive (then both mean the same) and otherwise answers ``415`` saying so, rather than merge
a list the wrong way.
"""

from __future__ import annotations

import copy
from typing import Any

from devplug.testing.apiserver.errors import ApiStatusError, bad_request

__all__ = ["json_patch", "merge_patch", "strategic_as_merge"]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _has_list_or_directive(value: Any) -> bool:
    if isinstance(value, list):
        return True
    if isinstance(value, dict):
        return any(k.startswith("$") or _has_list_or_directive(v) for k, v in value.items())
    return False


def strategic_as_merge(target: Any, patch: Any) -> Any:
    """A strategic merge patch without lists or ``$`` directives, which equals the same merge patch."""
    if _has_list_or_directive(patch):
        raise ApiStatusError(
            415,
            "UnsupportedMediaType",
            "the API server stand-in models a strategic merge patch only without lists or $-directives (then it "
            "equals a JSON merge patch); send application/merge-patch+json, application/json-patch+json or "
            "application/apply-patch+yaml",
        )
    return merge_patch(target, patch)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(
            f"the server rejected our request due to an error in our request: invalid JSON pointer {path!r}"
        )
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    current = doc
    for part in parts[:-1]:
        current = current[int(part)] if isinstance(current, list) else current[part]
    return current


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 (``add``, ``remove``, ``replace``, ``move``, ``copy``, ``test``); a failing operation is ``422``
    as the server's ``jsonpatch`` errors are."""
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for raw_op in operations:
        op = raw_op
        try:
            kind, parts = op["op"], _pointer(op["path"])
            if kind in ("move", "copy"):
                source = _pointer(op["from"])
                holder = _parent(doc, source)
                value = copy.deepcopy(holder[int(source[-1])] if isinstance(holder, list) else holder[source[-1]])
                if kind == "move":
                    del holder[int(source[-1]) if isinstance(holder, list) else source[-1]]
                kind, op = "add", {**op, "value": value}
            if kind == "test":
                holder = _parent(doc, parts)
                found = (
                    doc if not parts else (holder[int(parts[-1])] if isinstance(holder, list) else holder[parts[-1]])
                )
                if found != op["value"]:
                    raise ValueError(f"testing value {op['path']} failed")
                continue
            if not parts:
                if kind in ("add", "replace"):
                    doc = copy.deepcopy(op["value"])
                    continue
                raise ValueError("cannot remove the whole document")
            holder = _parent(doc, parts)
            last = parts[-1]
            if isinstance(holder, list):
                index = len(holder) if last == "-" else int(last)
                if kind == "add":
                    holder.insert(index, copy.deepcopy(op["value"]))
                elif kind == "remove":
                    del holder[index]
                elif kind == "replace":
                    holder[index] = copy.deepcopy(op["value"])
                else:
                    raise ValueError(f"unexpected kind of operation {kind!r}")
            else:
                if kind in ("remove", "replace") and last not in holder:
                    raise ValueError(f"{kind} operation does not apply: doc is missing path: {op['path']}")
                if kind == "remove":
                    del holder[last]
                elif kind in ("add", "replace"):
                    holder[last] = copy.deepcopy(op["value"])
                else:
                    raise ValueError(f"unexpected kind of operation {kind!r}")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ApiStatusError(
                422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
            ) from None
    return doc
