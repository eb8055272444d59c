"""The kubelet's rule for extended resource names, and the socket and state folder names derived from them."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

__all__ = [
    "instance_tag",
    "invalid_resource_name_reason",
    "legacy_state_folder_names",
    "resource_state_dir",
    "socket_file_name",
]

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_REQUESTS_PREFIX = "requests."
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


def invalid_resource_name_reason(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource name, or ``None`` if it is valid.

    The kubelet accepts ``domain/name`` where the domain is a lowercase DNS-1123
    subdomain that is not a ``kubernetes.io/`` domain and the whole name does not
    start with ``requests.``; the name part is 1 to 63 characters of
    ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``. (``requests.`` is prepended to
    the domain when checking, so the domain may be at most 244 characters.)
    """
    if "/" not in name:
        return "it has no domain: use 'domain/name', e.g. 'example.com/gpu'"
    if "kubernetes.io/" in name:
        return "the kubernetes.io domains are reserved for native resources"
    if name.startswith(_REQUESTS_PREFIX):
        return "it must not start with 'requests.'"
    domain, _, short = name.partition("/")
    if "/" in short:
        return "it has more than one '/'"
    full_domain = _REQUESTS_PREFIX + domain
    if not domain or len(full_domain) > 253 or not _DNS1123_SUBDOMAIN.match(full_domain):
        return f"the domain {domain!r} is not a lowercase DNS-1123 subdomain"
    if not short or len(short) > 63 or not _QUALIFIED_NAME.match(short):
        return (
            f"the name {short!r} must be 1-63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def socket_file_name(resource_name: str, directory_len: int = 0, instance: str | None = None) -> str:
    """The bare file name of the plugin socket serving ``resource_name``.

    ``devplug-<domain>_<name>.sock`` (a domain never holds ``_``, so names stay
    unique); shortened with a hash when the full path would pass the 107-byte
    limit of a unix socket path. With ``instance`` (a daemon instance's tag,
    :func:`instance_tag`) the name ends ``-<tag>.sock``: two instances of the
    daemon on one node (a rolling update) then serve on different paths, as
    kubelets that key endpoints by socket path need (Kubernetes PR #135437).
    """
    suffix = f"-{instance}.sock" if instance else ".sock"
    safe = "devplug-" + resource_name.replace("/", "_") + suffix
    if directory_len + 1 + len(safe.encode()) <= MAX_SOCKET_PATH:
        return safe
    data = resource_name.encode()
    digest = f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"  # stable; no hashlib (OpenSSL) in the daemon
    return f"devplug-{digest}{suffix}"


def instance_tag(instance: str) -> str:
    """A short tag (8 hex digits) for a daemon instance's identity (a pod UID, say), for its socket names."""
    return f"{zlib.crc32(instance.encode()):08x}"


def resource_state_dir(state_dir: Path, resource_name: str) -> Path:
    """The folder of ``resource_name``'s own state: ``<state dir>/resources/<domain>/<name>``.

    Keyed by the resource name alone, so nothing else (the plugin folder, the
    socket name) can move it. A valid name (see
    :func:`invalid_resource_name_reason`) gives two plain file names: no
    ``/``, no ``..``, at most 244 and 63 characters.
    """
    domain, _, short = resource_name.partition("/")
    return state_dir / "resources" / domain / short


def legacy_state_folder_names(resource_name: str) -> tuple[str, ...]:
    """The names ``resources/<name>`` a resource's state folder had before :func:`resource_state_dir`.

    They followed the socket file name, which turned into a hash when the
    plugin folder's path was long: ``devplug-<domain>_<name>`` or
    ``devplug-<16 hex digits>``. Fixed here for good, whatever sockets are named later.
    """
    import hashlib  # only when an old layout is looked for: the daemon does not need OpenSSL otherwise

    digest = hashlib.sha256(resource_name.encode()).hexdigest()[:16]
    return "devplug-" + resource_name.replace("/", "_"), f"devplug-{digest}"
