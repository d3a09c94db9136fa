"""gettext catalogs: a .mo written byte for byte as msgfmt does, read back and filtered."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

from data_pipeline.corpus import gettext_catalogs as gc

HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"


def write_mo(path: Path, messages: dict[str, str]) -> None:
    """A GNU .mo file (little endian, no hash table) holding `messages` plus the header."""
    entries = sorted({"": HEADER, **messages}.items())
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    n = len(entries)
    orig_table, trans_table = 28, 28 + 8 * n
    data_start = 28 + 16 * n
    blob = b""
    orig, trans = [], []
    for s in ids:
        orig.append((len(s), data_start + len(blob)))
        blob += s + b"\0"
    for s in strs:
        trans.append((len(s), data_start + len(blob)))
        blob += s + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, n, orig_table, trans_table, 0, 0)
    out += b"".join(struct.pack("<2I", *e) for e in orig + trans)
    path.write_bytes(out + blob)


MESSAGES = {
    "Could not open the configuration file": "Die Konfigurationsdatei konnte nicht geöffnet werden",
    "_Save the current document": "Das aktuelle Dokument _speichern",
    "menu\x04Open a recent file": "Eine zuletzt verwendete Datei öffnen",
    "%d file was removed from the list\x00%d files were removed from the list": (
        "%d Datei wurde aus der Liste entfernt\x00%d Dateien wurden aus der Liste entfernt"
    ),
    "%s: %s (%d)": "%s: %s (%d)",
    "cannot read %s from the disk": "kann %d nicht von der Platte lesen",
    "Usage: foo [OPTION]...\nDo things.": "Aufruf: foo [OPTION]...\nMacht Dinge.",
    "  -v, --verbose  print more": "  -v, --verbose  mehr ausgeben",
    "snake_case names are kept as they are": "snake_case-Namen bleiben, wie sie sind",
}


def test_read_catalog_handles_context_plural_and_header(tmp_path: Path) -> None:
    mo = tmp_path / "demo.mo"
    write_mo(mo, MESSAGES)
    catalog = gc.read_catalog(mo)
    assert "" not in catalog  # header skipped
    assert catalog["Open a recent file"] == "Eine zuletzt verwendete Datei öffnen"  # context gone
    assert catalog["%d file was removed from the list"] == "%d Datei wurde aus der Liste entfernt"
    assert not any("Dateien" in v for v in catalog.values())  # only plural form 0


def test_catalog_pairs_filter_and_strip_mnemonics(tmp_path: Path) -> None:
    mo = tmp_path / "demo.mo"
    write_mo(mo, MESSAGES)
    filtered: Counter[str] = Counter()
    pairs = {p.en: p.de for p in gc.catalog_pairs([mo], filtered)}
    assert pairs["Save the current document"] == "Das aktuelle Dokument speichern"
    assert pairs["snake_case names are kept as they are"].startswith("snake_case")
    assert "%s: %s (%d)" not in pairs
    assert filtered["gettext_mostly_placeholders"] == 1
    assert filtered["gettext_placeholder_mismatch"] == 1  # %s vs %d
    assert filtered["gettext_multiline"] == 1
    assert filtered["gettext_option_help"] == 1
    assert all(p.source == "gettext" for p in gc.catalog_pairs([mo]))


def test_unreadable_catalog_is_counted_not_fatal(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"not a catalog")
    filtered: Counter[str] = Counter()
    assert list(gc.catalog_pairs([bad], filtered)) == []
    assert filtered["gettext_unreadable_catalog"] == 1


def test_catalog_paths_finds_site_packages_catalogs(tmp_path: Path) -> None:
    mo_dir = tmp_path / "pkg" / "locale" / "de" / "LC_MESSAGES"
    mo_dir.mkdir(parents=True)
    write_mo(mo_dir / "pkg.mo", MESSAGES)
    assert (mo_dir / "pkg.mo").resolve() in gc.catalog_paths(extra_roots=[tmp_path])
