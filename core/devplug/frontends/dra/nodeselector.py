"""Whether a claim's allocation is for this node: its ``status.allocation.nodeSelector`` against the node's name and
labels.

The scheduler writes the node selector of an allocation (for node-local devices: ``matchFields`` ``metadata.name``
``In [<node>]``); a kubelet asks its driver to prepare claims of its own pods only, but the driver must not take the
kubelet's word for where the claim was allocated: a pool name shared by several nodes (``[dra] pool``) matches
anywhere. :class:`NodeSelector` is a core/v1 ``NodeSelector`` matched as
``k8s.io/component-helpers/scheduling/corev1/nodeaffinity`` matches one (``nodeaffinity.go``,
``LazyErrorNodeSelector.Match``):

* the terms are ORed; a term without expressions and fields matches nothing (``isEmptyNodeSelectorTerm``);
* within a term, every ``matchExpressions`` requirement (against the node's labels) and every ``matchFields``
  requirement (against ``metadata.name``, the one field a node selector may name) must hold;
* expression operators as ``k8s.io/apimachinery/pkg/labels`` ``Requirement.Matches``: ``In`` (the label is there with
  one of the values), ``NotIn`` (it is not, or has none of them), ``Exists``, ``DoesNotExist``, ``Gt``/``Lt`` (the
  label's value, an integer, is greater/less than the one value); a requirement that does not parse (an unknown
  operator, ``In`` without values, ``Gt`` with a value that is no integer, ...) makes its term match nothing, and is
  reported when no term matches (``NewLazyErrorNodeSelector``'s parse errors);
* field requirements: ``In`` and ``NotIn`` with exactly one value (``nodeSelectorRequirementsAsFieldSelector``); a
  field other than ``metadata.name`` has the empty value.

:class:`NodeLabels` reads the node's labels from the API server when a selector needs them (one made of
``metadata.name`` alone, as the scheduler writes for node-local devices, needs no read), keeps them for ``ttl``
seconds, and is asked to read them again before a claim is refused for not matching them (a label set a moment ago).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["NodeLabels", "NodeLabelsError", "NodeSelector", "Requirement", "selector_of"]

_LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_FIELD_OPERATORS = ("In", "NotIn")
#: How long the node's labels are used before they are read again.
LABELS_TTL = 30.0


def _int(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


@dataclass(frozen=True)
class Requirement:
    """One requirement of a term: a label (``field`` False) or a field (``metadata.name``) compared by ``operator``;
    ``problem`` says why it does not parse (then it matches nothing)."""

    key: str
    operator: str
    values: tuple[str, ...]
    field: bool = False
    problem: str | None = None

    @classmethod
    def parse(cls, raw: Any, field: bool, where: str) -> Requirement:
        if not isinstance(raw, Mapping):
            return cls("", "", (), field, f"{where}: not a requirement")
        key, operator = str(raw.get("key", "")), str(raw.get("operator", ""))
        values = tuple(str(v) for v in raw.get("values") or ())
        allowed = _FIELD_OPERATORS if field else _LABEL_OPERATORS
        problem = None
        if operator not in allowed:
            problem = f'{where}.operator: Unsupported value: "{operator}": supported values: ' + ", ".join(
                f'"{o}"' for o in allowed
            )
        elif field and len(values) != 1:
            problem = f"{where}.values: Invalid value: {list(values)}: must have one element"
        elif operator in ("In", "NotIn") and not values:
            problem = f"{where}.values: for 'in', 'notin' operators, values set can't be empty"
        elif operator in ("Exists", "DoesNotExist") and values:
            problem = f"{where}.values: values set must be empty for exists and does not exist"
        elif operator in ("Gt", "Lt") and (len(values) != 1 or _int(values[0]) is None):
            problem = f"{where}.values: for 'Gt', 'Lt' operators, exactly one value, an integer, is required"
        elif not key:
            problem = f"{where}.key: Required value"
        return cls(key, operator, values, field, problem)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.problem is not None:
            return False
        if self.field:
            value = name if self.key == "metadata.name" else ""
            return (value == self.values[0]) == (self.operator == "In")
        has, value = self.key in labels, labels.get(self.key, "")
        if self.operator == "In":
            return has and value in self.values
        if self.operator == "NotIn":
            return not has or value not in self.values
        if self.operator == "Exists":
            return has
        if self.operator == "DoesNotExist":
            return not has
        mine, theirs = _int(value) if has else None, _int(self.values[0])
        if mine is None or theirs is None:
            return False
        return mine > theirs if self.operator == "Gt" else mine < theirs

    def __str__(self) -> str:
        shown = f" [{', '.join(self.values)}]" if self.values else ""
        return f"{self.key} {self.operator}{shown}"


@dataclass(frozen=True)
class NodeSelector:
    """A core/v1 ``NodeSelector``: its terms (ORed), each a tuple of requirements (ANDed); see the module."""

    terms: tuple[tuple[Requirement, ...], ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> NodeSelector:
        terms = []
        for i, term in enumerate(raw.get("nodeSelectorTerms") or ()):
            if not isinstance(term, Mapping):
                continue
            where = f"nodeSelectorTerms[{i}]"
            parsed = [
                Requirement.parse(r, False, f"{where}.matchExpressions[{j}]")
                for j, r in enumerate(term.get("matchExpressions") or ())
            ] + [
                Requirement.parse(r, True, f"{where}.matchFields[{j}]")
                for j, r in enumerate(term.get("matchFields") or ())
            ]
            if parsed:  # an empty term matches nothing: left out
                terms.append(tuple(parsed))
        return cls(tuple(terms))

    @property
    def needs_labels(self) -> bool:
        """Whether matching reads the node's labels (a selector of ``metadata.name`` alone does not)."""
        return any(not r.field for term in self.terms for r in term)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return any(all(r.matches(name, labels) for r in term) for term in self.terms)

    def problems(self) -> list[str]:
        """Why requirements do not parse (each makes its term match nothing)."""
        return [r.problem for term in self.terms for r in term if r.problem is not None]

    def __str__(self) -> str:
        if not self.terms:
            return "no term (matches no node)"
        return " OR ".join("{" + ", ".join(str(r) for r in term) + "}" for term in self.terms)


class NodeLabelsError(Exception):
    """The node's labels could not be read (the message says why)."""


class NodeLabels:
    """The labels of node ``name`` as the API server has them, read when asked and kept ``ttl`` seconds."""

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        ttl: float = LABELS_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.name = name
        self._ttl = ttl
        self._clock = clock
        self._labels: dict[str, str] | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()
        #: How many times the node was read.
        self.reads = 0

    @property
    def age(self) -> float | None:
        """Seconds since the labels were read (None: never)."""
        return None if self._labels is None else self._clock() - self._read_at

    async def get(self, *, fresh: bool = False) -> Mapping[str, str]:
        """The labels: those kept while younger than the ttl, unless ``fresh``; :class:`NodeLabelsError` when the
        API server cannot give them."""
        from lightkube.resources.core_v1 import Node

        from devplug.kube.client import describe_api_error

        async with self._lock:
            age = self.age
            if not fresh and self._labels is not None and age is not None and age < self._ttl:
                return self._labels
            try:
                node = await self._client.get(Node, self.name)
            except Exception as exc:
                raise NodeLabelsError(f"reading node {self.name} failed: {describe_api_error(exc)[0]}") from exc
            labels = node.metadata.labels if node.metadata is not None else None
            self._labels = dict(labels or {})
            self._read_at = self._clock()
            self.reads += 1
            return self._labels


def selector_of(allocation: Mapping[str, Any]) -> NodeSelector | None:
    """The allocation's node selector, or None when it has none (a network-attached device's allocation)."""
    raw = allocation.get("nodeSelector")
    return NodeSelector.parse(raw) if isinstance(raw, Mapping) else None
