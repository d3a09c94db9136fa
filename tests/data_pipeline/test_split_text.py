"""A prepared split's text is read only when it is what the manifest says: a flipped byte, a
truncated shard, a missing one or a manifest that points outside the data dir is one clear
error, or, when asked, a partial read that says how much it covers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipeline.manifest import read_manifest
from data_pipeline.text import SplitDamaged, read_split, read_split_text


def shard_of(data: Path) -> Path:
    (shard,) = read_manifest(data)["splits"]["test"]["shards"]
    return data / shard["name"]


def test_a_whole_split_reads_completely(prepared: Path) -> None:
    text = read_split(prepared, "test")
    assert text.complete and len(text.sources) == text.expected == 150
    assert read_split_text(prepared, "test") == (text.sources, text.targets)


@pytest.mark.parametrize("damage", ["flip a header byte", "truncate", "cut a member", "remove"])
def test_damaged_shard_is_refused_or_read_partially_when_asked(
    prepared_copy: Path, damage: str
) -> None:
    path = shard_of(prepared_copy)
    data = bytearray(path.read_bytes())
    if damage == "flip a header byte":
        data[100] ^= 0x20  # inside the first member's header (its name)
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "cut a member":
        path.write_bytes(bytes(data[: len(data) // 2 + 300]))
    else:
        path.unlink()
    with pytest.raises(SplitDamaged) as err:
        read_split(prepared_copy, "test")
    message = str(err.value)
    assert "\n" not in message and message.startswith("the test split is damaged: ")
    assert str(path) in message
    partial = read_split(prepared_copy, "test", allow_damaged=True)
    assert not partial.complete and partial.expected == 150
    assert len(partial.sources) < 150 and len(partial.damaged) == 1


def test_shard_names_must_stay_inside_the_data_dir(prepared_copy: Path) -> None:
    manifest_path = prepared_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["test"]["shards"][0]["name"] = "../../etc/passwd"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not a relative path inside the data directory"):
        read_manifest(prepared_copy)
