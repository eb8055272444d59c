"""Label and field selectors, parsed and matched as ``k8s.io/apimachinery`` does.

* Label selectors (``labels.Parse``): comma-separated requirements ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
  ``k notin (a,b)``, ``k`` (exists), ``!k`` (does not exist), ``k>n`` and ``k<n`` (integers); a syntax error is
  ``400 BadRequest`` ``unable to parse requirement: ...``. ``!=`` and ``notin`` also match objects without the
  label, as upstream.
* Field selectors (``fields.ParseSelector``): ``k=v``, ``k==v``, ``k!=v`` only; a field the resource does not
  support is ``400 BadRequest`` ``field label not supported: <field>`` (the conversion funcs each resource
  registers, e.g. ``AddFieldLabelConversionFunc`` for ``resource.k8s.io`` and ``pkg/apis/core/v1/conversion.go``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from devplug.testing.apiserver.errors import bad_request

__all__ = ["FieldSelector", "LabelSelector"]

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return False
        if number is None:
            return False
        return number > int(self.values[0]) if self.op == ">" else number < int(self.values[0])


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def _check_key(key: str, term: str) -> str:
    if not _KEY.match(key) or len(key.rpartition("/")[2]) > 63:
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {term!r}")
    return key


def _check_value(value: str, term: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise bad_request(f"unable to parse requirement: invalid label value {value!r} in {term!r}")
    return value


class LabelSelector:
    """A parsed label selector; the empty one matches everything."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.requirements: list[_Requirement] = [self._parse(term) for term in _split_terms(text)]

    @staticmethod
    def _parse(term: str) -> _Requirement:
        set_based = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", term)
        if set_based:
            key, op, inner = set_based.groups()
            values = tuple(_check_value(v.strip(), term) for v in inner.split(",")) if inner.strip() else ()
            if not values:
                raise bad_request(
                    f"unable to parse requirement: for 'in', 'notin' operators, values set can't be empty in {term!r}"
                )
            return _Requirement(_check_key(key, term), op, values)
        for op in ("==", "!=", "=", ">", "<"):
            if op in term:
                key, _, value = term.partition(op)
                if op in (">", "<") and not value.strip().lstrip("-").isdigit():
                    raise bad_request(
                        "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer "
                        f"in {term!r}"
                    )
                checked = _check_value(value.strip(), term) if op not in (">", "<") else value.strip()
                return _Requirement(_check_key(key.strip(), term), "=" if op == "==" else op, (checked,))
        if term.startswith("!"):
            return _Requirement(_check_key(term[1:].strip(), term), "!")
        return _Requirement(_check_key(term, term), "exists")

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)


class FieldSelector:
    """A parsed field selector over the fields ``supported`` names (400 for any other); empty matches all."""

    def __init__(self, text: str, supported: Collection[str]) -> None:
        self.text = text
        self.terms: list[tuple[str, str, bool]] = []
        for term in _split_terms(text):
            negated = "!=" in term
            key, _, value = term.replace("!=", "=", 1).replace("==", "=", 1).partition("=")
            if not _:
                raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
            key = key.strip()
            if key not in supported:
                raise bad_request(f"field label not supported: {key}")
            self.terms.append((key, value.strip(), negated))

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all((fields.get(key, "") == value) != negated for key, value, negated in self.terms)

    def required(self, key: str) -> str | None:
        """The value an equality term demands of ``key`` (None when the selector does not pin it)."""
        for k, value, negated in self.terms:
            if k == key and not negated:
                return value
        return None
