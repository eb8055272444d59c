"""devplug's pytest plugin, loaded through the ``pytest11`` entry point."""
