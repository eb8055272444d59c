"""The API server's errors: ``Status`` objects, and field errors with the text ``apimachinery`` gives them.

Follows ``k8s.io/apimachinery/pkg/api/errors`` (``NewNotFound``, ``NewAlreadyExists``, ``NewConflict``,
``NewInvalid``, ``NewBadRequest``, ``NewResourceExpired``, ``NewTooManyRequests``, ``NewInternalError``,
``NewTimeoutError``, ``NewApplyConflict``) and ``k8s.io/apimachinery/pkg/util/validation/field`` (``Error.Error``
and ``ErrorBody``: ``<field>: Invalid value: "<value>": <detail>``; a ``Status`` of reason ``Invalid`` carries each
as a cause with reason ``FieldValue<Type>``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ApiStatusError", "FieldError", "invalid"]

#: ``field.ErrorType`` -> (the cause's reason, the text ``ErrorBody`` starts with).
_TYPES = {
    "invalid": ("FieldValueInvalid", "Invalid value"),
    "required": ("FieldValueRequired", "Required value"),
    "duplicate": ("FieldValueDuplicate", "Duplicate value"),
    "forbidden": ("FieldValueForbidden", "Forbidden"),
    "too_many": ("FieldValueTooMany", "Too many"),
    "too_long": ("FieldValueTooLong", "Too long"),
    "not_supported": ("FieldValueNotSupported", "Unsupported value"),
    "internal": ("InternalError", "Internal error"),
}
_OMIT = object()


def _show(value: Any) -> str:
    """A bad value as ``ErrorBody`` prints it: strings quoted (``%q``), numbers and booleans bare, else JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: its type (a key of ``_TYPES``), the field path, the bad value and the detail."""

    type: str
    field: str
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        """``ErrorBody``: the text without the field path."""
        text = _TYPES[self.type][1]
        if self.type not in ("required", "forbidden", "too_long", "internal") and self.value is not _OMIT:
            text += f": {_show(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def text(self) -> str:
        """``Error()``: ``<field>: <body>``."""
        return f"{self.field}: {self.body()}"

    def cause(self) -> dict[str, Any]:
        return {"reason": _TYPES[self.type][0], "message": self.body(), "field": self.field}


class ApiStatusError(Exception):
    """An API error: its HTTP code, reason and message become a ``Status`` body (the client sees exactly that).

    ``kind`` is the resource (plural, as ``details.kind`` holds it), ``group`` its API group (empty for core).
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        name: str | None = None,
        group: str = "",
        kind: str = "",
        *,
        causes: Sequence[dict[str, Any]] = (),
        retry_after: int | None = None,
        extra_metadata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = list(causes)
        self.retry_after = retry_after
        self.extra_metadata = extra_metadata or {}

    def status(self) -> dict[str, Any]:
        """The ``Status`` object (``metav1.Status``) the server answers with."""
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.extra_metadata),
            "status": "Failure",
            "message": str(self),
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:  # StatusReasonUnknown is "", which the Status omits (omitempty)
            del body["reason"]
        if details:
            body["details"] = details
        return body


def invalid(kind: str, group: str, plural: str, name: str, errors: Sequence[FieldError]) -> ApiStatusError:
    """``errors.NewInvalid``: 422, ``<Kind>[.<group>] "<name>" is invalid: <error>`` (several in brackets)."""
    qualified = f"{kind}.{group}" if group else kind
    texts = [e.text() for e in errors]
    listed = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return ApiStatusError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {listed}',
        name,
        group,
        kind,
        causes=[e.cause() for e in errors],
    )


def bad_request(message: str) -> ApiStatusError:
    """``errors.NewBadRequest``: 400 with no details."""
    return ApiStatusError(400, "BadRequest", message)
