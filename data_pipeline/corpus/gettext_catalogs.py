"""English -> German pairs from installed gettext catalogs (.mo files).

Catalogs come from ``/usr/share/locale/de/LC_MESSAGES`` and from ``locale/de/LC_MESSAGES``
directories inside Python site-packages. The stdlib parser (`gettext.GNUTranslations`) reads
them: keys are msgids, ``(msgid, n)`` for plural forms (we take form 0, which for German is the
singular that matches the English msgid), and ``context\\x04msgid`` for messages with a context.
UI strings are noisy, so entries with newlines/tabs, command-line option help, mostly-placeholder
strings and pairs whose placeholders differ are dropped here, each counted by reason.
"""

from __future__ import annotations

import gettext
import re
import site
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from data_pipeline.corpus.pairs import RawPair

SYSTEM_LOCALE_DIRS = (
    Path("/usr/share/locale/de/LC_MESSAGES"),
    Path("/usr/share/locale/de_DE/LC_MESSAGES"),
)
PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?(?:\([^)]*\))?[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t)?[sdifuxXcgeEopr%]"
    r"|\{[^{}\s]*\}|\$\{?[A-Za-z_]\w*\}?|<[^<>]+>|&[a-z]+;"
)
_MNEMONIC = re.compile(r"(?<![\w&_])[_&](?=\w)")


def catalog_paths(extra_roots: Iterable[Path] = ()) -> list[Path]:
    """German .mo files of the system and of Python site-packages (sorted, deduplicated)."""
    found: set[Path] = set()
    for d in SYSTEM_LOCALE_DIRS:
        if d.is_dir():
            found.update(d.glob("*.mo"))
    roots = {Path(p) for p in site.getsitepackages() if p}
    roots.add(Path(sysconfig.get_paths()["purelib"]))
    roots.update(Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    roots.update(extra_roots)
    for root in sorted(roots):
        if root.is_dir():
            found.update(root.glob("**/locale/de/LC_MESSAGES/*.mo"))
    return sorted(p.resolve() for p in found)


def read_catalog(path: Path) -> dict[str, str]:
    """msgid -> msgstr of one .mo (contexts stripped, plural form 0, header skipped)."""
    with open(path, "rb") as f:
        catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for key, value in catalog.items():
        if isinstance(key, tuple):
            msgid, form = key
            if form != 0:
                continue
        else:
            msgid = key
        msgid = msgid.split("\x04", 1)[-1]  # drop "context\x04"
        if msgid and value:
            out.setdefault(msgid, value)
    return out


def strip_mnemonics(text: str) -> str:
    """Remove keyboard accelerator marks (``_File``, ``&Open``) but not ``snake_case``."""
    return _MNEMONIC.sub("", text)


def reject_reason(en: str, de: str) -> str | None:
    """Why a catalog entry is not usable as a sentence pair, or None if it is."""
    if any(c in s.strip() for s in (en, de) for c in "\n\t\r"):
        return "gettext_multiline"
    if en.lstrip().startswith("-") or " --" in en or "  " in en.strip():
        return "gettext_option_help"
    en_ph, de_ph = PLACEHOLDER.findall(en), PLACEHOLDER.findall(de)
    if sorted(en_ph) != sorted(de_ph) and not any("$" in p for p in en_ph + de_ph):
        return "gettext_placeholder_mismatch"
    words = len(PLACEHOLDER.sub(" ", en).split())
    if en_ph and len(en_ph) * 2 >= words:
        return "gettext_mostly_placeholders"
    return None


def catalog_pairs(paths: Iterable[Path], filtered: Counter[str] | None = None) -> Iterator[RawPair]:
    """Pairs of the given catalogs; one group per (catalog, msgid) — strings tie them further."""
    for path in paths:
        try:
            catalog = read_catalog(path)
        except (OSError, UnicodeDecodeError, ValueError, LookupError):
            if filtered is not None:
                filtered["gettext_unreadable_catalog"] += 1
            continue
        for msgid, msgstr in catalog.items():
            en, de = strip_mnemonics(msgid), strip_mnemonics(msgstr)
            reason = reject_reason(en, de)
            if reason:
                if filtered is not None:
                    filtered[reason] += 1
                continue
            yield RawPair(en=en, de=de, source="gettext", group=f"gettext:{path.stem}:{msgid}")
