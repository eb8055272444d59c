"""The ``devplug`` command line: the click commands (:mod:`devplug.cli.commands`), ``devplug run`` without click
(:mod:`devplug.cli.run`), ``devplug reload``'s client, ``devplug status``'s table and the daemon's log output.

Nothing is imported here, so ``devplug run`` loads none of click's commands (tests/test_cli.py).
"""
