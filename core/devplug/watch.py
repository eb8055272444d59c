"""Deprecated name of :mod:`devplug.host.watch`, kept for drivers until devplug 1.0 (import that module instead).

Importing it warns (``DeprecationWarning``) and gives the very module :mod:`devplug.host.watch`, so what a driver or its
tests patch on the old name is patched where devplug reads it.
"""

from __future__ import annotations

import sys
import warnings

import devplug.host.watch as _moved
from devplug.host.watch import *  # noqa: F403 -- the names drivers imported from here

warnings.warn(
    "devplug.watch is now devplug.host.watch; the old name goes in devplug 1.0", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = _moved
