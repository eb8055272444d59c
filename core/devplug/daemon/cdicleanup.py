"""CDI spec files no resource serves any more (``[cdi] enabled``): those of kinds the config no longer has, deleted at
start; that of a resource a reload tore down, deleted unless a resource of the config still uses its kind. Each
resource keeps its own current file (:class:`~devplug.daemon.cdispecs.CdiSpecs`)."""

from __future__ import annotations

from devplug.config import Config
from devplug.daemon.cdispecs import remove_stale_specs
from devplug.engine import Resource, spec_file_name
from devplug.errors import ConfigError

__all__ = ["remove_spec_of", "remove_stale_cdi_specs"]


def remove_stale_cdi_specs(config: Config) -> None:
    """Delete the spec files of kinds no resource of ``config`` has; :class:`ConfigError` when ``[cdi] spec_dir``
    cannot be used."""
    cdi = config.cdi
    if not cdi.enabled:
        return
    try:
        remove_stale_specs(cdi.spec_dir, {spec_file_name(rc.cdi_kind) for rc in config.resources})
    except OSError as exc:
        raise ConfigError(
            f"{config.path or '<config>'}: cdi.spec_dir: cannot use {cdi.spec_dir}: {exc.strerror or exc}"
        ) from exc


async def remove_spec_of(gone: Resource, config: Config) -> None:
    """A resource torn down by a reload: delete its CDI spec unless a resource of ``config`` (a restarted one, or
    another with the same ``cdi_kind``) keeps using it; else it would offer devices nobody serves."""
    if any(rc.cdi_kind == gone.config.cdi_kind for rc in config.resources) and config.cdi.enabled:
        return
    await gone.remove_cdi_spec()
