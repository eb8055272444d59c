"""One request's view of a kind in the version its URL names: bodies converted in and out, unknown fields handled.

The stand-in stores one form of each kind (v1's for ``resource.k8s.io``); a request to ``resource.k8s.io/v1beta1``
reads and writes it through :class:`Codec`, as the real server decodes each request into its internal type and
encodes each answer in the request's version (:mod:`.versions` for the conversions and each release's fields).

**Fields the version does not have** (a device's ``taints`` sent to a 1.32 server, whose v1beta1 has none):

* **server-side apply**: refused, ``500`` with a ``Status`` of no reason and the message
  ``failed to create typed patch object (<namespace>/<name>; resource.k8s.io/<version>, Kind=<Kind>):
  .spec.devices[0].basic.taints: field not declared in schema`` (several: ``errors:`` and one per line). The
  apply handler types the configuration against the version's schema before anything else
  (``k8s.io/apimachinery/pkg/util/managedfields/internal/structuredmerge.go``, ``Apply``: ``ObjectToTyped`` of the
  patch object, its error wrapped by ``fmt.Errorf``, which ``responsewriters.ErrorToAPIStatus`` makes a 500 with
  ``StatusReasonUnknown``), whatever ``fieldValidation`` says: kubernetes/kubernetes#122480 shows that body for
  ``.spec.topologyKeys`` of a Service, #139253 (open in 2026) asks for a 400 instead;
* **create, update and the other patches**: ``fieldValidation`` decides (``handlers/rest.go``,
  ``fieldValidation``: an empty directive is ``Warn``; kubectl sends ``Strict``, lightkube nothing): ``Strict`` is
  ``400 BadRequest`` ``<Kind> in version "<version>" cannot be handled as a <Kind>: strict decoding error: unknown
  field "spec.devices[0].basic.taints"`` (``handlers/create.go`` and ``transformDecodeError``); ``Warn`` drops the
  field and answers with a ``Warning: 299 - "unknown field \\"spec.devices[0].basic.taints\\""`` header per field
  (``addStrictDecodingWarnings``); ``Ignore`` drops it silently.

Only the structs :mod:`.versions` describes are checked; core kinds and Leases are served as stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devplug.testing.apiserver import versions
from devplug.testing.apiserver.errors import ApiStatusError, bad_request
from devplug.testing.apiserver.resources import Resource

__all__ = ["Codec"]


class Codec:
    """``resource`` as ``resource.k8s.io/<version>`` of ``release`` shows it (core kinds: as stored); one per
    request, collecting the warnings its writes earn (:attr:`warnings`)."""

    def __init__(self, resource: Resource, version: str, release: versions.Release) -> None:
        self.resource = resource
        self.version = version
        self.release = release
        self.schema = versions.schema(resource.kind, version, release) if resource.group == versions.GROUP else None
        #: ``Warning`` header texts of this request (unknown fields dropped under ``fieldValidation=Warn``).
        self.warnings: list[str] = []

    @property
    def api_version(self) -> str:
        return f"{self.resource.group}/{self.version}" if self.resource.group else self.version

    # --- answers

    def out(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A stored object as this version shows it."""
        if self.schema is None or not isinstance(obj, Mapping) or obj.get("kind") != self.resource.kind:
            return dict(obj)
        return versions.to_version(self.resource.kind, self.version, self.release, obj)

    def out_list(self, listed: Mapping[str, Any]) -> dict[str, Any]:
        if self.schema is None:
            return dict(listed)
        return {**listed, "apiVersion": self.api_version, "items": [self.out(i) for i in listed.get("items") or ()]}

    def event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """A watch event: its object in this version (a BOOKMARK's bare object gets this apiVersion)."""
        obj = event.get("object")
        if self.schema is None or not isinstance(obj, Mapping) or event.get("type") == "ERROR":
            return dict(event)
        if event.get("type") == "BOOKMARK":
            return {**event, "object": {**obj, "apiVersion": self.api_version}}
        return {**event, "object": self.out(obj)}

    # --- writes

    def _check_api_version(self, body: Mapping[str, Any]) -> None:
        sent = body.get("apiVersion")
        if sent not in (None, "", self.api_version) and body.get("kind") in (None, "", self.resource.kind):
            raise bad_request(
                f"the API version in the data ({sent}) does not match the expected API version ({self.api_version})"
            )

    def into(self, body: Any, *, apply: bool, validation: str | None) -> Any:
        """A body sent in this version, in the stored form; unknown fields as the module's docstring says."""
        if self.schema is None or not isinstance(body, Mapping):
            return body
        self._check_api_version(body)
        unknown = versions.unknown_fields(self.schema, body)
        if unknown:
            if apply:
                raise self._typed_patch_error(body, unknown)
            texts = [f'unknown field "{versions.path_text(p, leading_dot=False)}"' for p in unknown]
            if validation == "Strict":
                kind = self.resource.kind
                raise bad_request(
                    f'{kind} in version "{self.version}" cannot be handled as a {kind}: strict decoding error: '
                    + ", ".join(texts)
                )
            if validation != "Ignore":
                self.warnings.extend(texts)
            body = versions.project(self.schema, body)
        return versions.from_version(self.resource.kind, self.version, body)

    def _typed_patch_error(self, body: Mapping[str, Any], unknown: list[tuple[str, ...]]) -> ApiStatusError:
        meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        errors = [f"{versions.path_text(p, leading_dot=True)}: field not declared in schema" for p in unknown]
        listed = errors[0] if len(errors) == 1 else "\n  ".join(["errors:", *errors])
        where = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}; {self.api_version}, Kind={self.resource.kind}"
        return ApiStatusError(500, "", f"failed to create typed patch object ({where}): {listed}")
