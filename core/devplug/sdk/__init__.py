"""The driver SDK: ``devplug new-driver NAME`` writes a driver distribution's skeleton (:mod:`devplug.sdk.skeleton`).

The hook methods it generates are rendered from :mod:`devplug.hookspecs` itself
(:mod:`devplug.sdk.hookstubs`): signatures and docstrings cannot drift from the
contract. The file templates are package data under ``templates/``.
"""

from __future__ import annotations

from devplug.sdk.skeleton import SkeletonError, SkeletonNames, new_driver, skeleton_names

__all__ = ["SkeletonError", "SkeletonNames", "new_driver", "skeleton_names"]
