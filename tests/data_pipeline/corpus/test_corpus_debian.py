"""fetch_debian_ende end to end without network: failure on an unreachable archive, and a full
build from a pre-filled cache (a .deb made with dpkg-deb, plain Translation indexes)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from data_pipeline.corpus import CorpusUnavailable, fetch_debian_ende
from data_pipeline.corpus.apt import PrivateApt

pytestmark = pytest.mark.skipif(
    not (shutil.which("apt-get") and shutil.which("dpkg-deb")), reason="needs Debian's apt"
)

UNREACHABLE = """\
Types: deb
URIs: http://127.0.0.1:9/debian
Suites: bookworm
Components: main
Trusted: yes
"""
FAST_FAIL = {"Acquire::Retries": "0"}


def test_unreachable_archive_raises_one_line(tmp_path: Path) -> None:
    with pytest.raises(CorpusUnavailable) as info:
        fetch_debian_ende(
            tmp_path, apt_sources=UNREACHABLE, apt_options=FAST_FAIL, log=lambda m: None
        )
    message = str(info.value)
    assert "\n" not in message
    assert "paperscale corpus synthetic DIR" in message
    assert "paperscale prepare" in message and "DIR/train.en" in message
    assert not (tmp_path / "train.en").exists()


def test_invalid_sources_list_raises(tmp_path: Path) -> None:
    apt = PrivateApt(tmp_path / "apt", sources="this is not a sources file\n", options=FAST_FAIL)
    with pytest.raises(CorpusUnavailable, match="apt-get update"):
        apt.update()


def test_private_config_keeps_translations_and_own_dirs(tmp_path: Path) -> None:
    apt = PrivateApt(tmp_path / "apt", sources=UNREACHABLE)
    conf = apt.config.read_text()
    assert str(tmp_path / "apt" / "lists") in conf
    assert 'Acquire::Languages { "en"; "de"; };' in conf
    parts = (tmp_path / "apt" / "apt.conf.d").iterdir()
    assert not any("Languages" in p.read_text(errors="replace") for p in parts)


DING_LINES = [
    "# Version :: test",
    "Er ist sehr müde. :: He is very tired.",
    "Das Haus ist alt. :: The house is old.",
    "ein altes Haus {n} | alte Häuser {pl} :: an old house | old houses",
    "Wir gehen heute ins Kino. :: We are going to the cinema today.",
]


def make_cache(out: Path, n_packages: int = 30) -> None:
    """The cache a previous run would have left: lists with Translation indexes, a Ding .deb."""
    lists = out / ".cache" / "apt" / "lists"
    lists.mkdir(parents=True)
    en, de = [], []
    for i in range(n_packages):
        md5 = f"{i:032x}"
        en.append(
            f"Package: pkg{i}\nDescription-md5: {md5}\n"
            f"Description-en: tool number {i} for testing things\n"
            f" This tool number {i} does many useful things. It is fast.\n"
        )
        de.append(
            f"Package: pkg{i}\nDescription-md5: {md5}\n"
            f"Description-de: Werkzeug Nummer {i} zum Testen von Dingen\n"
            f" Dieses Werkzeug Nummer {i} tut viele nützliche Dinge. Es ist schnell.\n"
        )
    prefix = "deb.example.org_debian_dists_bookworm_main_i18n_Translation-"
    (lists / (prefix + "en")).write_text("\n".join(en))
    (lists / (prefix + "de")).write_text("\n".join(de))
    root = out / "pkgroot"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: trans-de-en\nVersion: 1.0-1\nArchitecture: all\n"
        "Maintainer: Test <test@example.org>\nDescription: test dictionary\n"
    )
    (root / "usr" / "share" / "trans").mkdir(parents=True)
    (root / "usr" / "share" / "trans" / "de-en").write_text("\n".join(DING_LINES) + "\n")
    deb_dir = out / ".cache" / "ding"
    deb_dir.mkdir(parents=True)
    subprocess.run(
        ["dpkg-deb", "--build", str(root), str(deb_dir / "trans-de-en_1.0-1_all.deb")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    shutil.rmtree(root)


def test_build_from_cache_without_network(tmp_path: Path) -> None:
    make_cache(tmp_path)
    # unreachable sources prove that a filled cache needs no network
    stats = fetch_debian_ende(
        tmp_path, valid_size=4, test_size=4, apt_sources=UNREACHABLE, log=lambda m: None
    )
    assert stats["splits"]["valid"] == 4 and stats["splits"]["test"] == 4
    total = sum(stats["splits"].values())
    # per package a summary and 2 sentences, but "It is fast." is kept once; 4 Ding pairs
    assert total == 30 * 2 + 1 + 4
    assert stats["filtered"]["duplicate_pair"] == 29
    assert stats["families"]["ding"]["kept"] == 4
    assert stats["sources"]["ddtp/summary"]["kept"] == 30
    assert stats["filtered"]["too_short"] >= 1  # "old houses" / "alte Häuser"
    assert json.loads((tmp_path / "corpus.json").read_text()) == stats
    lines = {}
    for split in ("train", "valid", "test"):
        en = (tmp_path / f"{split}.en").read_text(encoding="utf-8").splitlines()
        de = (tmp_path / f"{split}.de").read_text(encoding="utf-8").splitlines()
        assert len(en) == len(de) == stats["splits"][split]
        lines[split] = (set(en), set(de))
    for held in ("valid", "test"):
        assert not lines[held][0] & lines["train"][0]
        assert not lines[held][1] & lines["train"][1]
    # a package's sentences stay together
    train_en = "\n".join(lines["train"][0])
    for sentence in lines["valid"][0] | lines["test"][0]:
        if sentence.startswith("This tool number"):
            number = sentence.split()[3]
            assert f"tool number {number} for testing" not in train_en
    again = fetch_debian_ende(
        tmp_path, valid_size=4, test_size=4, apt_sources=UNREACHABLE, log=lambda m: None
    )
    assert again == stats


def test_train_order_source_groups_the_same_pairs_by_source(tmp_path: Path) -> None:
    make_cache(tmp_path)
    shuffled = fetch_debian_ende(
        tmp_path, valid_size=4, test_size=4, apt_sources=UNREACHABLE, log=lambda m: None
    )
    pairs = lambda split: list(  # noqa: E731
        zip(
            (tmp_path / f"{split}.en").read_text(encoding="utf-8").splitlines(),
            (tmp_path / f"{split}.de").read_text(encoding="utf-8").splitlines(),
            strict=True,
        )
    )
    before = {s: pairs(s) for s in ("train", "valid", "test")}
    by_source = fetch_debian_ende(
        tmp_path, valid_size=4, test_size=4, apt_sources=UNREACHABLE, log=lambda m: None,
        train_order="source",
    )  # fmt: skip
    assert by_source["train_order"] == "source" and shuffled["train_order"] == "shuffled"
    after = {s: pairs(s) for s in ("train", "valid", "test")}
    assert after["valid"] == before["valid"] and after["test"] == before["test"]
    assert sorted(after["train"]) == sorted(before["train"]) and after["train"] != before["train"]
    # the 4 Ding pairs come as one block (ddtp/... sorts before ding/...)
    ding_en = {line.split(" :: ")[1].split(" | ")[0] for line in DING_LINES[1:]}
    positions = [i for i, (en, _) in enumerate(after["train"]) if en in ding_en]
    assert len(positions) >= 2
    assert positions == list(range(positions[0], positions[0] + len(positions)))
