"""One kind of :class:`~devplug.testing.apiserver.storage.Storage` seen as a store of its own, in process.

:class:`devplug.testing.leaseapi.LeaseStore` and :class:`devplug.testing.podapi.PodStore` are such views (the
names drivers' suites used before the one stand-in); their ``requests`` are the HTTP requests on that kind, as
``(method, namespace or "*", name or None, code)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devplug.testing.apiserver.resources import by_plural
from devplug.testing.apiserver.storage import Storage, Writer

__all__ = ["KindView"]


class KindView:
    """The verbs on one kind (``plural``) of ``storage``, written as ``manager``."""

    def __init__(self, storage: Storage, plural: str, manager: str = "devplug-testing") -> None:
        self.storage = storage
        self.resource = by_plural(plural)
        self.writer = Writer(manager)

    @property
    def requests(self) -> list[tuple[str, str, str | None, int]]:
        """The HTTP requests on this kind: (method, namespace, or ``*`` across namespaces, name or None, code)."""
        return [
            (r.method, r.namespace or ("*" if self.resource.namespaced else ""), r.name, r.code)
            for r in list(self.storage.requests)
            if r.resource == self.resource.plural
        ]

    def create(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.storage.create(self.resource, namespace, obj, self.writer)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.storage.get(self.resource, namespace, name)

    def update(self, namespace: str, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.storage.update(self.resource, namespace, name, obj, self.writer)

    def delete(self, namespace: str, name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self.storage.delete(self.resource, namespace, name, options, self.writer)

    def list(self, namespace: str | None, label_selector: str = "", field_selector: str = "") -> dict[str, Any]:
        return self.storage.list(self.resource, namespace, label_selector=label_selector, field_selector=field_selector)
