"""``python -m devplug``: the same as the ``devplug`` command."""

from devplug.cli import main

main()
