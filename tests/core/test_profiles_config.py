"""Per-node profiles in the config (issue 29): the merge rules, the choice from node labels, and ``check-config``
checking every profile at once with errors naming the file, the profile, the resource and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devplug.config import Config, load_config
from devplug.config.dra import NODE_NAME_ENV
from devplug.errors import ConfigError
from devplug.profiles.compose import check_profiles, compose
from devplug.profiles.select import select

BASE = """
[state]
dir = "state"

[resources."example.com/mock"]
driver = "mock"
options = { directory = "devs", count = 4 }
replicas = 2
hook_timeout = 5

[resources."example.com/vf"]
driver = "mock"
options = { directory = "vfs", count = 8 }
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "devplug.toml"
    path.write_text(text)
    return path


def _load(tmp_path: Path, profiles: str) -> Config:
    return load_config(_write(tmp_path, profiles + BASE))  # first: a bare key (profiles = 3) is then top-level


def _resources(config: Config) -> dict[str, object]:
    return {rc.name: rc for rc in config.resources}


def test_a_key_overrides_a_table_replaces_and_remove_drops(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        """
[profiles.big]
remove = ["example.com/vf"]
[profiles.big.resources."example.com/mock"]
options = { directory = "devs" }     # replaces the whole options table: count goes back to the driver's default
hook_timeout = 9                      # overrides the base's key; replicas (not named) stays the base's
[profiles.big.resources."example.com/new"]
driver = "mock"
options = { directory = "new", count = 1 }
""",
    )
    assert config.profiles.names() == ("big",) and config.applied == ()
    composed = compose(config, ["big"])
    by_name = {rc.name: rc for rc in composed.resources}
    assert sorted(by_name) == ["example.com/mock", "example.com/new"]
    mock = by_name["example.com/mock"]
    assert (mock.options.count, mock.replicas, mock.hook_timeout) == (None, 2, 9.0)
    assert mock.options.directory == (tmp_path / "devs").resolve(), "relative paths still follow the config file"
    assert by_name["example.com/new"].options.count == 1
    assert composed.applied == ("big",) and composed.path == config.path
    # the base is untouched, and composing with no profile is the base itself
    assert [rc.options.count for rc in config.resources] == [4, 8]
    assert compose(config, []) is config


def test_a_profile_switches_a_resource_between_the_device_plugin_api_and_dra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NODE_NAME_ENV, "node-a")
    config = _load(
        tmp_path,
        """
[profiles.to-dra.resources."example.com/vf"]
api = "dra"
dra = { driver_name = "vf.example.com" }
""",
    )
    dra = compose(config, ["to-dra"])
    vf = next(rc for rc in dra.resources if rc.name == "example.com/vf")
    assert vf.api == "dra" and vf.dra is not None and vf.dra.driver_name == "vf.example.com"
    # and back: a DRA base, a profile moving it to the device-plugin API drops its dra table with unset
    back = load_config(
        _write(
            tmp_path,
            BASE.replace("count = 8 }\n", 'count = 8 }\napi = "dra"\ndra = { pool = "vfs" }\n')
            + """
[profiles.to-device-plugin.resources."example.com/vf"]
api = "device-plugin"
unset = ["dra"]
[profiles.forgot-unset.resources."example.com/vf"]
api = "device-plugin"
dra = { driver_name = "vf.example.com" }
""",
        )
    )
    assert next(rc for rc in back.resources if rc.name == "example.com/vf").api == "dra"
    moved = compose(back, ["to-device-plugin"])
    assert next(rc for rc in moved.resources if rc.name == "example.com/vf").api == "device-plugin"
    with pytest.raises(ConfigError) as forgot:
        compose(back, ["forgot-unset"])
    assert str(forgot.value).startswith(f'{tmp_path / "devplug.toml"} with profile "forgot-unset": ')
    assert 'resources."example.com/vf".dra: only for a resource served through DRA' in str(forgot.value)


def test_a_profile_moving_a_resource_to_dra_needs_the_node_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NODE_NAME_ENV, raising=False)
    config = _load(tmp_path, '[profiles.to-dra.resources."example.com/vf"]\napi = "dra"\n')
    with pytest.raises(ConfigError) as refused:
        compose(config, ["to-dra"])
    path = tmp_path / "devplug.toml"
    assert str(refused.value).startswith(f'{path} with profile "to-dra": resources."example.com/vf"')
    assert "needs the node's name" in str(refused.value)


@pytest.mark.parametrize(
    ("profiles", "expected"),
    [
        ("[profiles.Big]\nremove = ['example.com/vf']\n", "profiles.Big: 'Big' cannot name a profile"),
        ("[profiles.\"a.b\"]\nremove = ['example.com/vf']\n", "profiles.\"a.b\": 'a.b' cannot name a profile"),
        ("[profiles.big]\nremvoe = ['example.com/vf']\n", "profiles.big.remvoe: unknown key"),
        ("[profiles.big]\n", "profiles.big: changes nothing"),
        ("[profiles.big]\nremove = ['example.com/gpu']\n", "profiles.big.remove: 'example.com/gpu' is not a resource"),
        ("[profiles.big]\nremove = 'example.com/vf'\n", "profiles.big.remove: expected a list of resource names"),
        (
            "[profiles.big]\nremove = ['example.com/vf']\nresources.\"example.com/vf\".replicas = 2\n",
            'profiles.big.resources."example.com/vf": the profile also removes this resource',
        ),
        (
            "[profiles.big.resources.\"example.com/vf\"]\nunset = ['rename']\n",
            "profiles.big.resources.\"example.com/vf\".unset: the base table of 'example.com/vf' does not set rename",
        ),
        (
            "[profiles.big.resources.\"example.com/gpu\"]\ndriver = 'mock'\nunset = ['rename']\n",
            "'example.com/gpu' is not in the base config, so there is nothing to unset",
        ),
        (
            "[profiles.big]\nmatch_labels = { 'a/b/c' = 'x' }\nremove = ['example.com/vf']\n",
            'profiles.big.match_labels."a/b/c": not a node label key',
        ),
        (
            "[profiles.big]\nmatch_labels = { 'vendor' = 'a,b' }\nremove = ['example.com/vf']\n",
            "profiles.big.match_labels.vendor: 'a,b' is not a label value",
        ),
        ("profiles = 3\n", "profiles: expected a table of profiles"),
    ],
)
def test_a_malformed_profile_fails_the_load_naming_file_profile_and_key(
    tmp_path: Path, profiles: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, profiles)
    assert str(refused.value).startswith(f"{tmp_path / 'devplug.toml'}: "), str(refused.value)
    assert expected in str(refused.value)


def test_the_node_labels_choose_profiles_by_name_and_by_match_labels(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        """
[profiles.big.resources."example.com/mock"]
options = { directory = "devs", count = 16 }
[profiles.vf32]
match_labels = { "feature.node.kubernetes.io/pci-8086.present" = "true", "example.com/nic" = "e810" }
resources."example.com/vf".options = { directory = "vfs", count = 32 }
[profiles.vf16.resources."example.com/vf"]
options = { directory = "vfs", count = 16 }
""",
    )
    profiles = config.profiles
    assert select(profiles, {}).names == ()
    assert select(profiles, {"devplug.io/profile": "big"}).reasons == (("big", "node label devplug.io/profile=big"),)
    nfd = {"feature.node.kubernetes.io/pci-8086.present": "true", "example.com/nic": "e810"}
    chosen = select(profiles, {**nfd, "devplug.io/profile": "big"})
    assert chosen.names == ("big", "vf32")
    assert dict(chosen.reasons)["vf32"] == (
        "match_labels feature.node.kubernetes.io/pci-8086.present=true, example.com/nic=e810"
    )
    assert select(profiles, {"example.com/nic": "e810"}).names == (), "every match_label must match"
    assert select(profiles, {"devplug.io/profile": "vf16.big"}).names == ("vf16", "big")
    composed = compose(config, chosen.names)
    assert [rc.options.count for rc in composed.resources] == [16, 32]

    with pytest.raises(ConfigError) as unknown:
        select(profiles, {"devplug.io/profile": "big.huge"})
    assert str(unknown.value) == (
        f"the node label devplug.io/profile=big.huge names profile 'huge', which {tmp_path / 'devplug.toml'} does "
        "not define; it defines: big, vf32, vf16"
    )
    with pytest.raises(ConfigError) as conflict:
        select(profiles, {**nfd, "devplug.io/profile": "vf16"})
    assert str(conflict.value) == (
        f'{tmp_path / "devplug.toml"}: the node\'s labels choose vf16, vf32, but profiles "vf16" and "vf32" '
        'conflict: both change "example.com/vf"; a node may match only one of them (change its labels, or move '
        "the change into one profile)"
    )


def test_check_profiles_composes_each_profile_on_its_own(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        """
[profiles.good.resources."example.com/mock"]
replicas = 4
[profiles.typo.resources."example.com/mock"]
options = { directory = "devs", cuont = 2 }
[profiles.nodriver.resources."example.com/gpu"]
options = { directory = "gpus" }
""",
    )
    checks = {c.profile.name: c for c in check_profiles(config)}
    assert checks["good"].error is None and checks["good"].config is not None
    assert [rc.replicas for rc in checks["good"].config.resources] == [4, 1]
    path = tmp_path / "devplug.toml"
    assert str(checks["typo"].error) == (
        f'{path} with profile "typo": resources."example.com/mock".options.cuont: unknown key; did you mean \'count\'?'
    )
    assert str(checks["nodriver"].error).startswith(
        f'{path} with profile "nodriver": resources."example.com/gpu".driver: missing'
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=60)


def test_check_config_reports_every_profile_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        BASE
        + """
[profiles.big]
description = "16 devices"
resources."example.com/mock".options = { directory = "devs", count = 16 }
[profiles.no-vf]
match_labels = { "example.com/nic" = "none" }
remove = ["example.com/vf"]
[profiles.typo.resources."example.com/mock"]
replicas = 0
[profiles.bad-vf.resources."example.com/vf"]
hook_timeout = "soon"
""",
    )
    result = _cli("check-config", str(path))
    assert result.returncode == 2, result
    assert result.stdout.splitlines() == [
        f"{path}: ok",
        "  example.com/mock: driver mock, 2 replicas per device",
        "  example.com/vf: driver mock",
        "profiles (4), each checked on its own over the base; a node chooses them with the label "
        "devplug.io/profile=<name>[.<name>...] or by a profile's match_labels:",
        "  big (16 devices): ok",
        "    changed example.com/mock: driver mock, 2 replicas per device",
        "  no-vf (match_labels example.com/nic=none): ok",
        "    removed example.com/vf",
        "  typo: INVALID",
        "  bad-vf: INVALID",
        "  note: big and typo conflict (both change example.com/mock): a node choosing both is refused",
        "  note: no-vf and bad-vf conflict (both change example.com/vf): a node choosing both is refused",
    ]
    assert result.stderr.splitlines() == [
        f'devplug: error: {path} with profile "typo": resources."example.com/mock".replicas: expected the number of '
        "containers that may share each device, an integer from 1 to 1024 (1: not shared), got 0",
        f'devplug: error: {path} with profile "bad-vf": resources."example.com/vf".hook_timeout: expected a number '
        "of seconds, got 'soon'",
    ]
    assert not (tmp_path / "state").exists(), "checked, nothing started"
    good = _write(tmp_path, BASE + '[profiles.big.resources."example.com/mock"]\nreplicas = 3\n')
    assert _cli("check-config", str(good)).returncode == 0


def test_the_docs_three_kinds_of_node_get_the_profiles_the_page_says(tmp_path: Path) -> None:
    """docs/operator/profiles.md's config, its profiles chosen for the three nodes of its table (the drivers' own
    checks need the hardware, so the resources are checked by shape only here: parse_profiles and the merge)."""
    import re

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    from devplug.config.profilemerge import check_references, merge
    from devplug.config.profiles import ProfileSet, parse_profiles

    page = (Path(__file__).resolve().parents[2] / "docs" / "operator" / "profiles.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", page, re.S)
    data = tomllib.loads(block)
    profiles = ProfileSet(parse_profiles(data, "profiles.md"), {k: v for k, v in data.items() if k != "profiles"})
    check_references(profiles)
    nfd = {"feature.node.kubernetes.io/pci-0200_8086_1592.present": "true"}
    assert select(profiles, {}).names == ()
    assert select(profiles, {"devplug.io/profile": "fpga-regions"}).names == ("fpga-regions",)
    big = select(profiles, {"devplug.io/profile": "dra", **nfd})
    assert big.names == ("dra", "vf32")
    merged = merge(profiles, [p for p in profiles.profiles if p.name in big.names])["resources"]
    assert merged["example.com/fpga"]["api"] == "dra" and merged["example.com/fpga"]["options"] == {"mode": "whole"}
    assert merged["example.com/vf"]["options"]["num_vfs"] == 32
    with pytest.raises(ConfigError, match='profiles "fpga-regions" and "dra" conflict'):
        select(profiles, {"devplug.io/profile": "fpga-regions.dra"})


def test_check_config_finds_profiles_that_are_fine_alone_but_clash_together(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        BASE
        + """
[profiles.shared.resources."example.com/mock"]
rename = "example.com/gpu"
[profiles.gpu.resources."example.com/gpu"]
driver = "mock"
options = { directory = "gpus" }
[profiles.other.resources."example.com/vf"]
replicas = 2
""",
    )
    result = _cli("check-config", str(path))
    assert result.returncode == 2, result
    out = result.stdout.splitlines()
    assert "  shared: ok" in out and "  gpu: ok" in out and "  other: ok" in out
    assert [line for line in out if "together" in line] == ["  shared with gpu: INVALID together"]
    assert result.stderr.splitlines() == [
        f'devplug: error: {path} with profiles "shared", "gpu": resources."example.com/mock".rename: resources '
        '"example.com/mock" and "example.com/gpu" would both be advertised as "example.com/gpu"; give each its own '
        "name"
    ]
