"""Tests for devplug.api.checkpoint: the kubelet's device-manager checkpoint file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from devplug.api import checkpoint
from devplug.api.checkpoint import (
    CHECKPOINT_FILE,
    NODE_WITHOUT_TOPOLOGY,
    CheckpointEntry,
    CheckpointError,
    KubeletCheckpoint,
    parse_checkpoint,
    read_checkpoint,
    serialize_checkpoint,
)

# --- Vectors produced by the kubelet's own code --------------------------------------------------
# GO_FILES and GO_HASH_INPUTS were produced by the kubelet's own checksum code (Kubernetes v1.32.10
# checksum.New over dump.ForHash, with go-spew and apimachinery's dump package taken from the vendor
# tree of a Kubernetes v1.32.10 build) and Go's json.Marshal of the checkpoint types, declared with the
# kubelet's names in a package named checkpoint, run with Go 1.19.8. Each entry is (checksum, file),
# the file being exactly what MarshalCheckpoint returns. "v1_*" are files in the layout of kubelets up to
# 1.19 (DeviceIDs a list, hashed with 1.19's spew printer). Go 1.19 writes "\b" and "\f" as \u0008 and
# \u000c; the Go >= 1.22 that Kubernetes v1.32 is built with writes them short (see test_b_and_f_...).

GO_FILES: dict[str, tuple[int, str]] = {
    "empty_nil": (
        1944006890,
        ('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1944006890}'),
    ),
    "empty_kubelet": (
        3467439661,
        ('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3467439661}'),
    ),
    "empty_nonnil": (
        2932075448,
        ('{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":2932075448}'),
    ),
    "one_entry": (
        3897607085,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c'
            '0e1f","ContainerName":"app","ResourceName":"example.com/gpu","DeviceIDs"'
            ':{"-1":["gpu0"]},"AllocResp":"CgsKA0RFVhIEZ3B1MA=="}],"RegisteredDevices'
            '":{"example.com/gpu":["gpu0","gpu1"]}},"Checksum":3897607085}'
        ),
    ),
    "multi": (
        4287665612,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c'
            '0e1f","ContainerName":"init","ResourceName":"example.com/gpu","DeviceIDs'
            '":{"0":["gpu0","gpu1"],"1":["gpu2"]},"AllocResp":"CgsKA0RFVhIEZ3B1MA=="}'
            ',{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c0e1f","ContainerName":"app",'
            '"ResourceName":"example.com/gpu","DeviceIDs":{"-1":["gpu9"],"1":["gpu3"]'
            ',"10":["gpu10"],"2":["gpu4"]},"AllocResp":"CgsKA0RFVhIEZ3B1MA=="},{"PodU'
            'ID":"b1c2d3e4-0000-4000-8000-0123456789ab","ContainerName":"main","Resou'
            'rceName":"vendor.io/nic","DeviceIDs":{"-1":["nic1","nic0"]},"AllocResp":'
            '""},{"PodUID":"b1c2d3e4-0000-4000-8000-0123456789ab","ContainerName":"ma'
            'in","ResourceName":"example.com/gpu","DeviceIDs":{"0":["gpu5"],"1":["gpu'
            '5"]},"AllocResp":"CgsKA0RFVhIEZ3B1MA=="}],"RegisteredDevices":{"B.io/y":'
            '["y0"],"a.io/x":[],"example.com/gpu":["gpu0","gpu1","gpu2","gpu3","gpu4"'
            ',"gpu5","gpu9","gpu10"],"example.com/gpu-mig":["mig0"],"vendor.io/nic":['
            '"nic0","nic1","nic2"]}},"Checksum":4287665612}'
        ),
    ),
    "alloc_all_bytes": (
        1727013438,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c'
            '0e1f","ContainerName":"app","ResourceName":"example.com/gpu","DeviceIDs"'
            ':{"0":["gpu0"]},"AllocResp":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8'
            "gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFV"
            "WV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiou"
            "MjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMH"
            "Cw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf"
            '4+fr7/P3+/w=="}],"RegisteredDevices":{"example.com/gpu":["gpu0"]}},"Chec'
            'ksum":1727013438}'
        ),
    ),
    "strings": (
        1149397269,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"pod \\"quoted\\" \\\\back\\\\slash","C'
            'ontainerName":"név\\n\\t\\r","ResourceName":"example.com/ü","DeviceIDs":{"-'
            '1":["é","日本","😀","\\u003c\\u0026\\u003e","\\u2028\\u2029","\\u0000\\u0001\\u001f'
            '\x7f","a b","\ufeff","\\\\u0041","\'","/","\x80ÿ߿ࠀ\uffff"]},"AllocResp":"PCY+"}],"Registere'
            'dDevices":{"\\u003ca\\u0026b\\u003e":["\\"","\\\\"],"Z":[],"z":["日本"],"é":["x"'
            '],"\\u2028":null}},"Checksum":1149397269}'
        ),
    ),
    "bf_escape": (
        1226599576,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"p\\u0008q\\u000cr","ContainerName"'
            ':"c","ResourceName":"r","DeviceIDs":{"-1":["\\u0008","\\u000c"]},"AllocRes'
            'p":""}],"RegisteredDevices":{"r\\u000c":["\\u0008"]}},"Checksum":122659957'
            "6}"
        ),
    ),
    "nil_vs_empty": (
        2385722808,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"c","Resourc'
            'eName":"r","DeviceIDs":null,"AllocResp":null},{"PodUID":"p2","ContainerN'
            'ame":"c","ResourceName":"r","DeviceIDs":{},"AllocResp":""},{"PodUID":"p3'
            '","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":[],"1":null},"'
            'AllocResp":null},{"PodUID":"","ContainerName":"","ResourceName":"","Devi'
            'ceIDs":null,"AllocResp":null}],"RegisteredDevices":{"r1":null,"r2":[]}},'
            '"Checksum":2385722808}'
        ),
    ),
    "int64_extremes": (
        135103893,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","Resource'
            'Name":"r","DeviceIDs":{"-10":["e"],"-2":["d"],"-9223372036854775808":["b'
            '"],"0":["c"],"9223372036854775807":["a"]},"AllocResp":"AQ=="}],"Register'
            'edDevices":{"r":["a","b","c","d","e"]}},"Checksum":135103893}'
        ),
    ),
    "kubelet_style": (
        307055390,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c'
            '0e1f","ContainerName":"app","ResourceName":"example.com/gpu","DeviceIDs"'
            ':{},"AllocResp":""},{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c0e1f","Co'
            'ntainerName":"app","ResourceName":"vendor.io/nic","DeviceIDs":{"-1":["ni'
            'c1"],"0":["nic0"]},"AllocResp":""}],"RegisteredDevices":{"example.com/gp'
            'u":[],"vendor.io/nic":["nic0","nic1"]}},"Checksum":307055390}'
        ),
    ),
    "nil_vs_empty_as_kubelet": (
        221884485,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"c","Resourc'
            'eName":"r","DeviceIDs":{},"AllocResp":""},{"PodUID":"p2","ContainerName"'
            ':"c","ResourceName":"r","DeviceIDs":{},"AllocResp":""},{"PodUID":"p3","C'
            'ontainerName":"c","ResourceName":"r","DeviceIDs":{"0":null,"1":null},"Al'
            'locResp":""},{"PodUID":"","ContainerName":"","ResourceName":"","DeviceID'
            's":{},"AllocResp":""}],"RegisteredDevices":{"r1":[],"r2":[]}},"Checksum"'
            ":221884485}"
        ),
    ),
    "v1_one_migrated": (
        2238732115,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c'
            '0e1f","ContainerName":"app","ResourceName":"example.com/gpu","DeviceIDs"'
            ':{"0":["gpu0","gpu1"]},"AllocResp":"CgsKA0RFVhIEZ3B1MA=="},{"PodUID":"b1'
            'c2d3e4-0000-4000-8000-0123456789ab","ContainerName":"main","ResourceName'
            '":"vendor.io/nic","DeviceIDs":{"0":["nic0"]},"AllocResp":"CgsKA0RFVhIEZ3'
            'B1MA=="}],"RegisteredDevices":{"example.com/gpu":["gpu0","gpu1","gpu2"],'
            '"vendor.io/nic":["nic0"]}},"Checksum":2238732115}'
        ),
    ),
    "v1_one": (
        2172522123,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c'
            '0e1f","ContainerName":"app","ResourceName":"example.com/gpu","DeviceIDs"'
            ':["gpu0","gpu1"],"AllocResp":"CgsKA0RFVhIEZ3B1MA=="},{"PodUID":"b1c2d3e4'
            '-0000-4000-8000-0123456789ab","ContainerName":"main","ResourceName":"ven'
            'dor.io/nic","DeviceIDs":["nic0"],"AllocResp":"CgsKA0RFVhIEZ3B1MA=="}],"R'
            'egisteredDevices":{"example.com/gpu":["gpu0","gpu1","gpu2"],"vendor.io/n'
            'ic":["nic0"]}},"Checksum":2172522123}'
        ),
    ),
    "v1_nil": (
        1526022968,
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"c","Resourc'
            'eName":"r","DeviceIDs":null,"AllocResp":null},{"PodUID":"p2","ContainerN'
            'ame":"c","ResourceName":"r","DeviceIDs":[],"AllocResp":""}],"RegisteredD'
            'evices":null},"Checksum":1526022968}'
        ),
    ),
    "v1_empty": (
        3467439661,
        ('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3467439661}'),
    ),
}
GO_HASH_INPUTS: dict[str, str] = {
    "empty_nil": (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEnt"
        "ry)<nil> RegisteredDevices:(map[string][]string)<nil>}"
    ),
    "one_entry": (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEnt"
        "ry)[{PodUID:(string)3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c0e1f ContainerName:("
        "string)app ResourceName:(string)example.com/gpu DeviceIDs:(checkpoint.De"
        "vicesPerNUMA)map[-1:[gpu0]] AllocResp:([]uint8)[10 11 10 3 68 69 86 18 4"
        " 103 112 117 48]}] RegisteredDevices:(map[string][]string)map[example.co"
        "m/gpu:[gpu0 gpu1]]}"
    ),
    "nil_vs_empty": (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEnt"
        "ry)[{PodUID:(string)p1 ContainerName:(string)c ResourceName:(string)r De"
        "viceIDs:(checkpoint.DevicesPerNUMA)<nil> AllocResp:([]uint8)<nil>} {PodU"
        "ID:(string)p2 ContainerName:(string)c ResourceName:(string)r DeviceIDs:("
        "checkpoint.DevicesPerNUMA)map[] AllocResp:([]uint8)[]} {PodUID:(string)p"
        "3 ContainerName:(string)c ResourceName:(string)r DeviceIDs:(checkpoint.D"
        "evicesPerNUMA)map[0:[] 1:<nil>] AllocResp:([]uint8)<nil>} {PodUID:(strin"
        "g) ContainerName:(string) ResourceName:(string) DeviceIDs:(checkpoint.De"
        "vicesPerNUMA)<nil> AllocResp:([]uint8)<nil>}] RegisteredDevices:(map[str"
        "ing][]string)map[r1:<nil> r2:[]]}"
    ),
    "int64_extremes": (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEnt"
        "ry)[{PodUID:(string)p ContainerName:(string)c ResourceName:(string)r Dev"
        "iceIDs:(checkpoint.DevicesPerNUMA)map[-9223372036854775808:[b] -10:[e] -"
        "2:[d] 0:[c] 9223372036854775807:[a]] AllocResp:([]uint8)[1]}] Registered"
        "Devices:(map[string][]string)map[r:[a b c d e]]}"
    ),
    "v1_nil": (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEnt"
        "ry)[{PodUID:(string)p1 ContainerName:(string)c ResourceName:(string)r De"
        "viceIDs:([]string)<nil> AllocResp:([]uint8)<nil>} {PodUID:(string)p2 Con"
        "tainerName:(string)c ResourceName:(string)r DeviceIDs:([]string)[] Alloc"
        "Resp:([]uint8)[]}] RegisteredDevices:(map[string][]string)<nil>}"
    ),
}

# GO_ACCEPTED are files that the same Go code (json.Unmarshal into the pre-made slice and map of
# ManagerImpl.getCheckpoint, then VerifyChecksum) accepts: Go's leniencies the parser must share.
GO_ACCEPTED: dict[str, bytes] = {
    "fold_keys": (
        b'{"data":{"poddeviceentries":[{"poduid":"p","CONTAINERNAME":"c","resource'
        b'name":"r","deviceids":{"0":["a"]},"allocresp":"AQ=="}],"registereddevice'
        b's":{"r":["a"]}},"checksum":4109197504}'
    ),
    "fold_kelvin": (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"'
        'c","Re\u017fourceName":"r","DeviceIDs":{"0":["a"]},"AllocResp":""'
        '}],"RegisteredDevices":{}},"Chec\u212a\u017fum":1200591068}'
    ).encode(),
    "dup_data": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","Resource'
        b'Name":"r","DeviceIDs":{"0":["a"]},"AllocResp":"AQ=="}]},"Data":{"Registe'
        b'redDevices":{"r":["a"]}},"Checksum":4109197504}'
    ),
    "dup_deviceids_merge": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","DeviceIDs":{"0":["a"],"1":["'
        b'b"]},"DeviceIDs":{"1":["c"],"2":null}}],"RegisteredDevices":{}},"Checksu'
        b'm":1897824043}'
    ),
    "dup_entries_merge": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"c1","Device'
        b'IDs":{"0":["a"]}},{"PodUID":"p2"}],"PodDeviceEntries":[{"ContainerName":'
        b'"x","DeviceIDs":{"1":["b"]}}]},"Checksum":3852631680}'
    ),
    "nulls": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":null,"ContainerName":"c","Resourc'
        b'eName":null,"DeviceIDs":{"0":null,"-1":[null,"x"]},"AllocResp":null},nul'
        b'l],"RegisteredDevices":{"r":null}},"Checksum":241602154}'
    ),
    "data_null": b'{"Data":null,"Checksum":2932075448}',
    "missing_all": b'{"Checksum":2932075448}',
    "unknown_fields": (
        b'{"Version":"v9","Data":{"Extra":[1,{"a":null}],"PodDeviceEntries":[{"Pod'
        b'UID":"p","Foo":1,"DeviceIDs":{}}],"RegisteredDevices":{}},"Checksum":856'
        b"01325}"
    ),
    "base64_newlines": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","AllocResp":"AQ\\nID\\r\\nBA=="}]},"Checksum":2812634451}'
    ),
    "base64_array": (b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","AllocResp":[1,2,255,0]}]},"Checksum":2272301368}'),
    "base64_trailing_bits": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","AllocResp":"AR=="}]},"Checksum":2905318562}'
    ),
    "numa_plus": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","DeviceIDs":{"+1":["a"],"01":'
        b'["b"],"-0":["c"]}}]},"Checksum":736900707}'
    ),
    "utf8_invalid": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"a\xffb\xe2\x82Ac\xed\xa0\x80d\xf0\x9f\x98","Dev'
        b'iceIDs":{"0":["\xc0\xaf"]}}],"RegisteredDevices":{"\xfe":["x"]}},"Che'
        b'cksum":3811960902}'
    ),
    "surrogate_escapes": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"\\ud800|\\ud83d\\ude00|\\ude00\\ud83d'
        b'|\\ud83dA|\\uDBFF\\uDFFF","DeviceIDs":{"0":["\\u00e9\\u0000"]}}]},"Checksum":'
        b"1178998430}"
    ),
    "whitespace_around": b' \n\t{"Data":{},"Checksum":2932075448}\r\n ',
    "v1_null_ids": (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","DeviceIDs":null}],"RegisteredDevices":{}},"Checksum":3838772924}'
    ),
}


def _go_file(name: str) -> bytes:
    return GO_FILES[name][1].encode()


# Files whose nil/empty choices are the kubelet's own, so serialize_checkpoint reproduces them exactly.
KUBELET_WRITTEN = [
    "empty_kubelet",
    "one_entry",
    "multi",
    "alloc_all_bytes",
    "int64_extremes",
    "kubelet_style",
    "nil_vs_empty_as_kubelet",
    "v1_one_migrated",
]

POD_A = "3f2a6c1e-8d4b-4c1a-9e2f-5b7d8a9c0e1f"
POD_B = "b1c2d3e4-0000-4000-8000-0123456789ab"
ALLOC = b"\n\x0b\n\x03DEV\x12\x04gpu0"  # a serialized ContainerAllocateResponse with envs {"DEV": "gpu0"}


@pytest.mark.parametrize("name", sorted(GO_FILES))
def test_every_go_file_parses_and_its_checksum_verifies(name: str) -> None:
    stored, text = GO_FILES[name]
    assert json.loads(text)["Checksum"] == stored
    parsed = parse_checkpoint(text.encode())
    assert parse_checkpoint(serialize_checkpoint(parsed)) == parsed


@pytest.mark.parametrize("name", KUBELET_WRITTEN)
def test_serialize_reproduces_the_kubelet_bytes_and_checksum(name: str) -> None:
    stored, text = GO_FILES[name]
    parsed = parse_checkpoint(text.encode())
    assert serialize_checkpoint(parsed) == text.encode()
    assert checkpoint.checksum(parsed) == stored


@pytest.mark.parametrize(("name", "layout"), [(n, 1 if n.startswith("v1_") else 2) for n in sorted(GO_HASH_INPUTS)])
def test_hash_input_is_the_spew_rendering_and_checksum_is_its_fnv32a(name: str, layout: int) -> None:
    rendered = GO_HASH_INPUTS[name].encode()
    assert checkpoint._fnv32a(rendered) == GO_FILES[name][0]
    data, stored = checkpoint._dec_file(checkpoint._load_json(_go_file(name), "t"), layout)
    assert checkpoint._spew(data, layout) == rendered
    assert stored == GO_FILES[name][0]


def test_b_and_f_are_written_short_as_go_1_22_and_later_do() -> None:
    go_119 = _go_file("bf_escape")
    parsed = parse_checkpoint(go_119)
    written = serialize_checkpoint(parsed)
    assert written == (
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"p\\bq\\fr","ContainerName":"c","ResourceName":"r",'
        b'"DeviceIDs":{"-1":["\\b","\\f"]},"AllocResp":""}],"RegisteredDevices":{"r\\f":["\\b"]}},'
        b'"Checksum":1226599576}'
    )
    assert written.replace(b"\\b", b"\\u0008").replace(b"\\f", b"\\u000c") == go_119
    assert parse_checkpoint(written) == parsed
    assert parsed.entries[0].pod_uid == "p\bq\fr"


def test_empty_checkpoints() -> None:
    for name in ("empty_nil", "empty_kubelet", "empty_nonnil", "v1_empty"):
        assert parse_checkpoint(_go_file(name)) == KubeletCheckpoint((), {})
    assert serialize_checkpoint(KubeletCheckpoint()) == _go_file("empty_kubelet")
    assert checkpoint.checksum(KubeletCheckpoint()) == 3467439661
    # An empty v1 checkpoint hashes exactly like an empty v2 one: same type names, nothing else to tell.
    assert _go_file("v1_empty") == _go_file("empty_kubelet")


def test_one_entry_values() -> None:
    parsed = parse_checkpoint(_go_file("one_entry"))
    assert parsed == KubeletCheckpoint(
        (CheckpointEntry(POD_A, "app", "example.com/gpu", {NODE_WITHOUT_TOPOLOGY: ("gpu0",)}, ALLOC),),
        {"example.com/gpu": ("gpu0", "gpu1")},
    )
    assert serialize_checkpoint(parsed) == _go_file("one_entry")


def test_multi_values_keep_file_order_and_numa_nodes() -> None:
    parsed = parse_checkpoint(_go_file("multi"))
    assert [(e.pod_uid, e.container, e.resource) for e in parsed.entries] == [
        (POD_A, "init", "example.com/gpu"),
        (POD_A, "app", "example.com/gpu"),
        (POD_B, "main", "vendor.io/nic"),
        (POD_B, "main", "example.com/gpu"),
    ]
    assert dict(parsed.entries[1].devices_by_numa) == {-1: ("gpu9",), 1: ("gpu3",), 10: ("gpu10",), 2: ("gpu4",)}
    assert parsed.entries[1].device_ids == frozenset({"gpu9", "gpu3", "gpu10", "gpu4"})
    assert parsed.entries[2].devices_by_numa == {-1: ("nic1", "nic0")}
    assert parsed.entries[2].alloc_response == b""
    assert parsed.entries[3].devices_by_numa == {0: ("gpu5",), 1: ("gpu5",)}
    assert parsed.entries[3].device_ids == frozenset({"gpu5"})
    assert parsed.registered_devices == {
        "B.io/y": ("y0",),
        "a.io/x": (),
        "example.com/gpu": ("gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu9", "gpu10"),
        "example.com/gpu-mig": ("mig0",),
        "vendor.io/nic": ("nic0", "nic1", "nic2"),
    }
    assert parsed.entries_for("vendor.io/nic") == (parsed.entries[2],)
    assert parsed.entries_for("example.com/gpu") == (parsed.entries[0], parsed.entries[1], parsed.entries[3])
    assert parsed.entries_for("example.com/gpu-mig") == ()
    assert parsed.holders("example.com/gpu", "gpu2") == (parsed.entries[0],)
    assert parsed.holders("example.com/gpu", "gpu5") == (parsed.entries[3],)
    assert parsed.holders("vendor.io/nic", "gpu5") == ()
    assert parsed.holders("example.com/gpu", "gpu7") == ()


def test_alloc_response_with_every_byte_value() -> None:
    parsed = parse_checkpoint(_go_file("alloc_all_bytes"))
    assert parsed.entries[0].alloc_response == bytes(range(256))


def test_strings_are_kept_exactly() -> None:
    parsed = parse_checkpoint(_go_file("strings"))
    (entry,) = parsed.entries
    assert entry.pod_uid == 'pod "quoted" \\back\\slash'
    assert entry.container == "név\n\t\r"
    assert entry.resource == "example.com/ü"
    assert entry.devices_by_numa[-1] == (
        "é",
        "日本",
        "😀",
        "<&>",
        "\u2028\u2029",
        "\x00\x01\x1f\x7f",
        "a b",
        "\ufeff",
        "\\u0041",
        "'",
        "/",
        "\x80\xff\u07ff\u0800\uffff",
    )
    assert entry.alloc_response == b"<&>"
    assert parsed.registered_devices == {"é": ("x",), "<a&b>": ('"', "\\"), "\u2028": (), "z": ("日本",), "Z": ()}
    # The kubelet's RegisteredDevices lists are never nil, so the null for "\u2028" is written back as [].
    written = serialize_checkpoint(parsed)
    assert b'"\\u2028":[]' in written
    assert parse_checkpoint(written) == parsed


def test_nil_and_empty_read_alike_and_are_written_the_kubelets_way() -> None:
    parsed = parse_checkpoint(_go_file("nil_vs_empty"))
    assert parsed == KubeletCheckpoint(
        (
            CheckpointEntry("p1", "c", "r", {}, b""),
            CheckpointEntry("p2", "c", "r", {}, b""),
            CheckpointEntry("p3", "c", "r", {0: (), 1: ()}, b""),
            CheckpointEntry("", "", "", {}, b""),
        ),
        {"r1": (), "r2": ()},
    )
    assert serialize_checkpoint(parsed) == _go_file("nil_vs_empty_as_kubelet")
    assert checkpoint.checksum(parsed) == GO_FILES["nil_vs_empty_as_kubelet"][0]


def test_numa_nodes_at_the_int64_limits() -> None:
    parsed = parse_checkpoint(_go_file("int64_extremes"))
    assert parsed.entries[0].devices_by_numa == {
        2**63 - 1: ("a",),
        -(2**63): ("b",),
        0: ("c",),
        -2: ("d",),
        -10: ("e",),
    }


def test_v1_layout_is_read_with_every_device_on_numa_node_0() -> None:
    parsed = parse_checkpoint(_go_file("v1_one"))
    assert parsed == KubeletCheckpoint(
        (
            CheckpointEntry(POD_A, "app", "example.com/gpu", {0: ("gpu0", "gpu1")}, ALLOC),
            CheckpointEntry(POD_B, "main", "vendor.io/nic", {0: ("nic0",)}, ALLOC),
        ),
        {"example.com/gpu": ("gpu0", "gpu1", "gpu2"), "vendor.io/nic": ("nic0",)},
    )
    # Written back in the v2 layout, as a 1.20-1.29 kubelet did after reading it.
    assert serialize_checkpoint(parsed) == _go_file("v1_one_migrated")
    assert checkpoint.checksum(parsed) == GO_FILES["v1_one_migrated"][0] != GO_FILES["v1_one"][0]


def test_v1_layout_with_nil_lists() -> None:
    # Parses as v2 (no DeviceIDs is a list) but only the v1 checksum matches.
    parsed = parse_checkpoint(_go_file("v1_nil"))
    assert parsed == KubeletCheckpoint(
        (CheckpointEntry("p1", "c", "r", {0: ()}, b""), CheckpointEntry("p2", "c", "r", {0: ()}, b"")),
        {},
    )


GO_ACCEPTED_VALUES: dict[str, KubeletCheckpoint] = {
    "fold_keys": KubeletCheckpoint((CheckpointEntry("p", "c", "r", {0: ("a",)}, b"\x01"),), {"r": ("a",)}),
    "fold_kelvin": KubeletCheckpoint((CheckpointEntry("p", "c", "r", {0: ("a",)}, b""),), {}),
    "dup_data": KubeletCheckpoint((CheckpointEntry("p", "c", "r", {0: ("a",)}, b"\x01"),), {"r": ("a",)}),
    "dup_deviceids_merge": KubeletCheckpoint((CheckpointEntry("p", "", "", {0: ("a",), 1: ("c",), 2: ()}),)),
    "dup_entries_merge": KubeletCheckpoint((CheckpointEntry("p1", "x", "", {0: ("a",), 1: ("b",)}),)),
    "nulls": KubeletCheckpoint(
        (CheckpointEntry("", "c", "", {0: (), -1: ("", "x")}), CheckpointEntry("", "", "", {})), {"r": ()}
    ),
    "data_null": KubeletCheckpoint(),
    "missing_all": KubeletCheckpoint(),
    "unknown_fields": KubeletCheckpoint((CheckpointEntry("p", "", "", {}),)),
    "base64_newlines": KubeletCheckpoint((CheckpointEntry("p", "", "", {}, b"\x01\x02\x03\x04"),)),
    "base64_array": KubeletCheckpoint((CheckpointEntry("p", "", "", {}, b"\x01\x02\xff\x00"),)),
    "base64_trailing_bits": KubeletCheckpoint((CheckpointEntry("p", "", "", {}, b"\x01"),)),
    "numa_plus": KubeletCheckpoint((CheckpointEntry("p", "", "", {1: ("b",), 0: ("c",)}),)),
    "utf8_invalid": KubeletCheckpoint(
        (
            CheckpointEntry(
                "a\ufffdb\ufffd\ufffdAc\ufffd\ufffd\ufffdd\ufffd\ufffd\ufffd", "", "", {0: ("\ufffd\ufffd",)}
            ),
        ),
        {"\ufffd": ("x",)},
    ),
    "surrogate_escapes": KubeletCheckpoint(
        (CheckpointEntry("\ufffd|😀|\ufffd\ufffd|\ufffdA|\U0010ffff", "", "", {0: ("é\x00",)}),)
    ),
    "whitespace_around": KubeletCheckpoint(),
    "v1_null_ids": KubeletCheckpoint((CheckpointEntry("p", "", "", {0: ()}),)),
}


@pytest.mark.parametrize("name", sorted(GO_ACCEPTED))
def test_go_leniencies_are_shared(name: str) -> None:
    parsed = parse_checkpoint(GO_ACCEPTED[name])
    assert parsed == GO_ACCEPTED_VALUES[name]
    assert parse_checkpoint(serialize_checkpoint(parsed)) == parsed


# --- Corrupt files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "kubelet_internal_checkpoint: not valid JSON (truncated or corrupt?): Expecting value"),
        (b"{not json", "kubelet_internal_checkpoint: not valid JSON (truncated or corrupt?): Expecting property name"),
        (b'{"Data":{},"Checksum":NaN}', "not valid JSON (truncated or corrupt?): NaN is not JSON"),
        (b'{"Data":{},"Checksum":1} x', "not valid JSON (truncated or corrupt?): Extra data"),
        (b"\xef\xbb\xbf{}", "not valid JSON (truncated or corrupt?): Unexpected UTF-8 BOM"),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON: nested too deeply"),
    ],
)
def test_bad_json(data: bytes, message: str) -> None:
    with pytest.raises(CheckpointError) as err:
        parse_checkpoint(data)
    assert message in str(err.value)


@pytest.mark.parametrize("cut", [1, 10, 100, 400])
def test_truncated_file(cut: int) -> None:
    whole = _go_file("multi")
    with pytest.raises(
        CheckpointError, match=r"^kubelet_internal_checkpoint: not valid JSON \(truncated or corrupt\?\)"
    ):
        parse_checkpoint(whole[:-cut])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "kubelet_internal_checkpoint: expected a JSON object, got an array"),
        ('{"Data":[],"Checksum":0}', "kubelet_internal_checkpoint: Data: expected an object, got an array"),
        (
            '{"Data":{"PodDeviceEntries":{}},"Checksum":0}',
            "kubelet_internal_checkpoint: Data.PodDeviceEntries: expected a list of entries, got an object",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":"p"},"x"]},"Checksum":0}',
            "kubelet_internal_checkpoint: Data.PodDeviceEntries[1]: expected an object, got a string",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"PodUID":5}]},"Checksum":0}',
            "kubelet_internal_checkpoint: Data.PodDeviceEntries[0].PodUID: expected a string, got the number 5",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"ContainerName":true}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].ContainerName: expected a string, got true",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"DeviceIDs":"gpu0"}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].DeviceIDs: expected an object of NUMA node to device IDs, got a string",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"0":[1]}}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].DeviceIDs['0'][0]: expected a string, got the number 1",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"one":["a"]}}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].DeviceIDs: NUMA node 'one' is not an int64",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"9223372036854775808":["a"]}}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].DeviceIDs: NUMA node '9223372036854775808' is not an int64",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"AllocResp":"AQ="}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].AllocResp: not valid base64",
        ),
        (
            '{"Data":{"PodDeviceEntries":[{"AllocResp":[256]}]},"Checksum":0}',
            "Data.PodDeviceEntries[0].AllocResp[0]: expected an integer from 0 to 255, got the number 256",
        ),
        (
            '{"Data":{"RegisteredDevices":["gpu0"]},"Checksum":0}',
            "Data.RegisteredDevices: expected an object of resource to device IDs, got an array",
        ),
        (
            '{"Data":{"RegisteredDevices":{"r":"gpu0"}},"Checksum":0}',
            "Data.RegisteredDevices['r']: expected a list of strings, got a string",
        ),
        ('{"Data":{},"Checksum":"1"}', "Checksum: expected an integer from 0 to 18446744073709551615, got a string"),
        (
            '{"Data":{},"Checksum":-1}',
            "Checksum: expected an integer from 0 to 18446744073709551615, got the number -1",
        ),
        (
            '{"Data":{},"Checksum":1.0}',
            "Checksum: expected an integer from 0 to 18446744073709551615, got the number 1.0",
        ),
    ],
)
def test_wrong_types_name_the_field(text: str, message: str) -> None:
    with pytest.raises(CheckpointError) as err:
        parse_checkpoint(text.encode())
    assert message in str(err.value)


def test_checksum_mismatch_gives_both_values() -> None:
    stored, text = GO_FILES["one_entry"]
    tampered = text.replace(f'"Checksum":{stored}', '"Checksum":12345').encode()
    with pytest.raises(CheckpointError) as err:
        parse_checkpoint(tampered, source="/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
    assert str(err.value) == (
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint: "
        "checksum mismatch: the file says 12345, its contents hash to 3897607085"
    )


def test_changed_contents_fail_the_checksum() -> None:
    stored, text = GO_FILES["one_entry"]
    tampered = text.replace('["gpu0","gpu1"]', '["gpu0","gpu2"]').encode()
    with pytest.raises(CheckpointError, match=rf"checksum mismatch: the file says {stored}, its contents hash to \d+$"):
        parse_checkpoint(tampered)


def test_a_missing_or_null_checksum_is_zero_and_fails() -> None:
    with pytest.raises(CheckpointError, match="the file says 0, its contents hash to 2932075448"):
        parse_checkpoint(b"{}")
    with pytest.raises(CheckpointError, match="the file says 0, its contents hash to 1944006890"):
        parse_checkpoint(b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":null}')


def test_v1_layout_errors_are_reported_as_v1() -> None:
    stored, text = GO_FILES["v1_one"]
    tampered = text.replace(f'"Checksum":{stored}', '"Checksum":7').encode()
    with pytest.raises(CheckpointError) as err:
        parse_checkpoint(tampered)
    assert str(err.value) == (
        "kubelet_internal_checkpoint: as a pre-1.20 (v1 layout) checkpoint: "
        f"checksum mismatch: the file says 7, its contents hash to {stored}"
    )
    mixed = b'{"Data":{"PodDeviceEntries":[{"DeviceIDs":["a"]},{"DeviceIDs":{"0":["b"]}}]},"Checksum":0}'
    with pytest.raises(
        CheckpointError, match=r"v1 layout\) checkpoint: Data.PodDeviceEntries\[1\].DeviceIDs: expected a list"
    ):
        parse_checkpoint(mixed)


def test_a_file_meant_as_v2_reports_the_v2_error() -> None:
    data = b'{"Data":{"PodDeviceEntries":[{"PodUID":"p","DeviceIDs":{"0":["a"]},"AllocResp":"%"}]},"Checksum":0}'
    with pytest.raises(
        CheckpointError, match=r"^kubelet_internal_checkpoint: Data.PodDeviceEntries\[0\].AllocResp: not"
    ):
        parse_checkpoint(data)


# --- Files on disk --------------------------------------------------------------------------------


def test_read_checkpoint_missing_file_is_none(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path / CHECKPOINT_FILE) is None


def test_read_checkpoint_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(_go_file("multi"))
    assert read_checkpoint(path) == parse_checkpoint(_go_file("multi"))


def test_read_checkpoint_names_the_path_of_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(_go_file("multi")[:50])
    with pytest.raises(CheckpointError, match=rf"^{path}: not valid JSON \(truncated or corrupt\?\)"):
        read_checkpoint(path)


def test_read_checkpoint_wraps_os_errors(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_FILE
    path.mkdir()
    with pytest.raises(CheckpointError, match=rf"^{path}: cannot read the kubelet checkpoint: Is a directory$") as err:
        read_checkpoint(path)
    assert isinstance(err.value.__cause__, IsADirectoryError)


# --- The value types ------------------------------------------------------------------------------


def test_constants() -> None:
    assert CHECKPOINT_FILE == "kubelet_internal_checkpoint"
    assert NODE_WITHOUT_TOPOLOGY == -1
    assert issubclass(CheckpointError, ValueError)


def test_values_are_read_only_and_hashable() -> None:
    entry = CheckpointEntry("p", "c", "r", {1: ["b"], 0: ["a", "b"]})  # type: ignore[dict-item]
    assert entry.devices_by_numa == {0: ("a", "b"), 1: ("b",)}
    assert entry.device_ids == frozenset({"a", "b"})
    assert entry.alloc_response == b""
    with pytest.raises(TypeError):
        entry.devices_by_numa[2] = ("c",)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.pod_uid = "q"  # type: ignore[misc]
    same = CheckpointEntry("p", "c", "r", {0: ("a", "b"), 1: ("b",)})
    assert same == entry
    assert hash(same) == hash(entry)
    cp = KubeletCheckpoint([entry], {"r": ["a", "b"]})  # type: ignore[arg-type, dict-item]
    assert cp.entries == (entry,)
    assert cp.registered_devices == {"r": ("a", "b")}
    with pytest.raises(TypeError):
        cp.registered_devices["s"] = ()  # type: ignore[index]
    assert hash(cp) == hash(KubeletCheckpoint((same,), {"r": ("a", "b")}))
    assert cp != KubeletCheckpoint((same,), {"r": ("b", "a")})


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: CheckpointEntry("p", "c", "r", {"0": ("a",)}), TypeError),  # type: ignore[dict-item]
        (lambda: CheckpointEntry("p", "c", "r", {True: ("a",)}), TypeError),
        (lambda: CheckpointEntry("p", "c", "r", {2**63: ("a",)}), ValueError),
        (lambda: CheckpointEntry("p", "c", "r", {0: "ab"}), TypeError),  # type: ignore[dict-item]
        (lambda: CheckpointEntry("p", "c", "r", {0: ("\ud800",)}), ValueError),
        (lambda: CheckpointEntry(1, "c", "r", {}), TypeError),  # type: ignore[arg-type]
        (lambda: CheckpointEntry("p", "c", "r", {}, "x"), TypeError),  # type: ignore[arg-type]
        (lambda: KubeletCheckpoint(("x",)), TypeError),  # type: ignore[arg-type]
        (lambda: KubeletCheckpoint((), {"r": "ab"}), TypeError),  # type: ignore[dict-item]
    ],
)
def test_invalid_values_are_refused(make: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        make()  # type: ignore[operator]


ROUND_TRIPS = [
    KubeletCheckpoint(),
    KubeletCheckpoint((), {"example.com/gpu": ()}),
    KubeletCheckpoint((CheckpointEntry("", "", "", {}),)),
    KubeletCheckpoint(
        tuple(
            CheckpointEntry(
                f"pod-{i}", f"c{i % 3}", "example.com/gpu", {i % 4 - 1: (f"gpu{i}", f"gpu{i + 1}")}, bytes([i])
            )
            for i in range(50)
        ),
        {"example.com/gpu": tuple(f"gpu{i}" for i in range(51)), "vendor.io/nic": ()},
    ),
    KubeletCheckpoint(
        (
            CheckpointEntry(
                "uid \"'\\ \n\t\x00\x7f",
                "<script>&amp;</script>",
                "é/日本",
                {-1: ("\u2028", "\u2029", "😀", " "), 0: (), 7: ("", "")},
                b"\x00\xff" * 40,
            ),
        ),
        {"\x1b[0m": ("\b\f",), "": ("",)},
    ),
]


@pytest.mark.parametrize("value", ROUND_TRIPS)
def test_round_trip(value: KubeletCheckpoint) -> None:
    written = serialize_checkpoint(value)
    assert parse_checkpoint(written) == value
    assert json.loads(written)["Checksum"] == checkpoint.checksum(value)
    assert serialize_checkpoint(parse_checkpoint(written)) == written


def test_serialized_file_is_json_go_would_read() -> None:
    value = ROUND_TRIPS[-1]
    decoded = json.loads(serialize_checkpoint(value))
    assert list(decoded) == ["Data", "Checksum"]
    assert list(decoded["Data"]) == ["PodDeviceEntries", "RegisteredDevices"]
    entry = decoded["Data"]["PodDeviceEntries"][0]
    assert list(entry) == ["PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp"]
    assert entry["DeviceIDs"] == {"-1": ["\u2028", "\u2029", "😀", " "], "0": None, "7": ["", ""]}
    assert entry["ContainerName"] == "<script>&amp;</script>"
    assert b"<" not in serialize_checkpoint(value)
