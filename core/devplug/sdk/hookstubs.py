"""Hook methods for a driver skeleton, rendered from :mod:`devplug.hookspecs`: every hook, in the contract's order,
with the spec's own signature and docstring, and a minimal working body."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

from devplug import hookspecs
from devplug.drivers import HOOK_NAMES

__all__ = ["IMPORTS", "hook_first_lines", "hook_signature", "render_hooks", "required_imports"]

#: Where each name a hook signature uses comes from, for the skeleton's imports.
IMPORTS: Mapping[str, str] = {
    "Sequence": "collections.abc",
    "Mapping": "collections.abc",
    "Claim": "devplug",
    "ContainerAllocation": "devplug",
    "Device": "devplug",
    "DriverContext": "devplug",
    "Health": "devplug",
    "HealthReport": "devplug",
    "Replicas": "devplug",
}
_BUILTINS = {"None", "str", "int", "bool", "float"}
#: The skeleton's line length (its pyproject sets ruff's to the same).
LINE_LENGTH = 120


def hook_signature(name: str, *, method: bool = False) -> str:
    """``name(params) -> returns`` as written in :mod:`devplug.hookspecs` (``self`` first for a method)."""
    sig = inspect.signature(getattr(hookspecs, name))
    params = [f"{p.name}: {p.annotation}" for p in sig.parameters.values()]
    if method:
        params = ["self", *(_method_param(p) for p in params)]
    return f"{name}({', '.join(params)}) -> {sig.return_annotation}"


def hook_first_lines() -> dict[str, str]:
    """Each hook's docstring summary (its first line), by name, in the contract's order."""
    return {name: (inspect.getdoc(getattr(hookspecs, name)) or "").splitlines()[0] for name in HOOK_NAMES}


def required_imports() -> dict[str, list[str]]:
    """The modules and names the hook signatures need, e.g. ``{"collections.abc": ["Sequence"], ...}``."""
    needed: dict[str, set[str]] = {}
    for name in HOOK_NAMES:
        for word in set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", hook_signature(name))) - _BUILTINS:
            if word in HOOK_NAMES or word in inspect.signature(getattr(hookspecs, name)).parameters:
                continue
            if word not in IMPORTS:
                raise LookupError(f"hookspecs.{name} uses {word}, which devplug.sdk.hookstubs.IMPORTS does not place")
            needed.setdefault(IMPORTS[word], set()).add(word)
    return {module: sorted(names) for module, names in needed.items()}


def _docstring(name: str, indent: str) -> str:
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    if '"""' in doc or "\\" in doc:
        raise ValueError(f"hookspecs.{name}'s docstring cannot be copied into a skeleton (triple quote or backslash)")
    lines = doc.splitlines()
    body = "\n".join(f"{indent}{line}" if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}\n{body}\n{indent}"""' if len(lines) > 1 else f'{indent}"""{lines[0]}"""'


def render_hooks(bodies: Mapping[str, str]) -> str:
    """Every hook as a ``@hookimpl`` method of the skeleton's driver class, each with its body from ``bodies``
    (indented code); :class:`KeyError` names a hook the skeleton has no body for (a new hook in the contract)."""
    missing = [name for name in HOOK_NAMES if name not in bodies]
    if missing:
        raise KeyError(f"the driver skeleton has no body for the hooks {', '.join(missing)} of devplug.hookspecs")
    methods = []
    for name in HOOK_NAMES:
        methods.append(f"    @hookimpl\n{_def_line(name)}\n{_docstring(name, ' ' * 8)}\n{bodies[name]}")
    return "\n\n".join(methods)


def _def_line(name: str, width: int = LINE_LENGTH) -> str:
    """``def hook(self, ...) -> ...:`` indented as a method, wrapped as ruff's formatter would past ``width``."""
    line = f"    def {hook_signature(name, method=True)}:"
    if len(line) <= width:
        return line
    sig = inspect.signature(getattr(hookspecs, name))
    params = ", ".join(["self", *(_method_param(f"{p.name}: {p.annotation}") for p in sig.parameters.values())])
    return f"    def {name}(\n        {params}\n    ) -> {sig.return_annotation}:"


def _method_param(param: str) -> str:
    """A hook argument as a driver method declares it: one the core passes as None for some callers (``claim``)
    defaults to None."""
    return f"{param} = None" if param.endswith("| None") else param
