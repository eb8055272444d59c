"""Per-node profiles: one config for a whole fleet, each node running the base config changed by the profiles its
labels choose.

* :mod:`.model` -- the ``[profiles]`` tables and their shape;
* :mod:`.merge` -- what a profile means over the base config, and which profiles conflict;
* :mod:`.compose` -- the config a node runs (base + profiles, checked as any config), and ``check-config``'s check
  of every profile;
* :mod:`.select` -- which profiles a node's labels choose;
* :mod:`.nodewatch` -- reading and watching the daemon's own Node (through :mod:`devplug.kube.client`'s lightkube
  client, imported only when a config has profiles);
* :mod:`.nodeprofiles` -- the daemon's side: the labels seen, the profiles chosen and applied through the live
  reload, and what ``devplug status`` shows about them.

Nothing is imported here: :mod:`devplug.config` needs :mod:`.model` and :mod:`.merge` without the rest.
"""
