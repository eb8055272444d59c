"""Device nodes for kernel models and test drivers (from :mod:`devplug.kit.devnodes`, which the mock driver uses at
run time: production code may not import the test kit, so the module lives in the kit of drivers and this one names
it for tests). Every name of that module's ``__all__`` is here."""

from devplug.kit import devnodes
from devplug.kit.devnodes import *  # noqa: F403  (the one list is devnodes.__all__)

__all__ = devnodes.__all__
