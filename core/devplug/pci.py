"""Deprecated name of :mod:`devplug.kit.pci`, kept for drivers until devplug 1.0 (import that module instead).

Importing it warns (``DeprecationWarning``) and gives the very module :mod:`devplug.kit.pci`, so what a driver or its
tests patch on the old name is patched where devplug reads it.
"""

from __future__ import annotations

import sys
import warnings

import devplug.kit.pci as _moved
from devplug.kit.pci import *  # noqa: F403 -- the names drivers imported from here

warnings.warn("devplug.pci is now devplug.kit.pci; the old name goes in devplug 1.0", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
