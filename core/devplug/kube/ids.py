"""Kubernetes identifiers taken from the wire or the API server, checked before they name a file, a URL or a log line.

A kubelet call (``NodePrepareResources``, ``NodeUnprepareResources``) or an
object read from the API server names things by strings devplug then builds
paths from: a claim's UID names its CDI spec files, its namespace and name
make the URL it is read from, a pod's UID names cgroup folders. The API server
only ever hands out identifiers of the forms below; anything else did not come
from it (a forged call on the plugin socket, a planted file) and is refused
before it is used, so ``/etc/x`` or ``../ledger`` never becomes a path.

The forms, as Kubernetes validates them (``k8s.io/apimachinery``):

* **UIDs** (``metadata.uid``, ``types.UID``): set by the API server when an
  object is created, from ``k8s.io/apimachinery/pkg/util/uuid.NewUUID``, an
  RFC 4122 UUID in its canonical text form (``uuid.New().String()``: 32 hex
  digits in groups of 8-4-4-4-12 joined by ``-``, lowercase). RFC 4122 reads
  hex digits in either case, so either is accepted here; nothing else is.
* **namespaces**: DNS-1123 labels (``ValidateNamespaceName`` is
  ``NameIsDNSLabel``, ``validation.IsDNS1123Label``): 1 to 63 lowercase letters,
  digits and ``-``, starting and ending with a letter or digit.
* **names** of ResourceClaims (and most objects): DNS-1123 subdomains
  (``NameIsDNSSubdomain``, ``validation.IsDNS1123Subdomain``): at most 253
  characters, DNS-1123 labels joined by ``.``.

None of these can hold ``/``, a NUL, a control character, or be ``.`` or ``..``.
Each ``*_problem`` function returns why a value is not of its form (for a
message), or None when it is; values are shown escaped and shortened
(:mod:`devplug.text.logsafe`), since they may carry anything.
"""

from __future__ import annotations

import re

from devplug.text.logsafe import shorten

__all__ = [
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "dns1123_label_problem",
    "dns1123_subdomain_problem",
    "is_uid",
    "uid_problem",
]

#: ``validation.DNS1123LabelMaxLength``.
DNS1123_LABEL_MAX = 63
#: ``validation.DNS1123SubdomainMaxLength``.
DNS1123_SUBDOMAIN_MAX = 253

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_UID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def is_uid(value: str) -> bool:
    """Whether ``value`` is a Kubernetes UID: a UUID in its canonical 8-4-4-4-12 form (see the module)."""
    return _UID_RE.fullmatch(value) is not None


def uid_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes UID, or None when it is one."""
    if is_uid(value):
        return None
    return f"'{shorten(value)}' is not a Kubernetes UID (a UUID such as 0b5e3f9c-6d7a-4c1e-9f3b-2a8d4e6c1b0a)"


def dns1123_label_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (``IsDNS1123Label``: a namespace), or None when it is one."""
    if len(value) <= DNS1123_LABEL_MAX and _LABEL_RE.fullmatch(value):
        return None
    return (
        f"'{shorten(value)}' is not a DNS-1123 label (1 to {DNS1123_LABEL_MAX} lowercase letters, digits and '-', "
        "starting and ending with a letter or digit)"
    )


def dns1123_subdomain_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (``IsDNS1123Subdomain``: an object's name), or None when it is."""
    if len(value) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN_RE.fullmatch(value):
        return None
    return (
        f"'{shorten(value)}' is not a DNS-1123 subdomain (at most {DNS1123_SUBDOMAIN_MAX} characters: "
        "lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit)"
    )
