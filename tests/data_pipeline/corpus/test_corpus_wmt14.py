"""fetch_wmt14_ende without the internet: small archives in the statmt.org layouts (tgz members
``training/europarl-v7.de-en.en``, ``commoncrawl.de-en.de``, ``dev/newstest2013.en``,
``test-full/newstest2014-deen-src.en.sgm`` ...), served from a pre-filled cache or a local HTTP
server; one-line errors for an unreachable or stalled server and for damaged data."""

from __future__ import annotations

import functools
import http.server
import io
import json
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from data_pipeline.corpus import CorpusUnavailable, fetch_wmt14_ende
from data_pipeline.corpus.wmt14 import ARCHIVES, Archive, read_sgm
from launch.cli import main as cli_main

EUROPARL = (
    ["Resumption of the session", "I declare resumed the session.", ""],
    ["Wiederaufnahme der Sitzungsperiode", "Ich erkläre die Sitzung für wieder aufgenommen.", "x"],
)
# A carriage return and a U+2028 inside a line must not split it; tabs/runs become one space.
COMMONCRAWL = (
    ["iron cement\ris a ready", "Leo  Tolstoy\tbooks", "Line\u2028separator here"],
    ["Eisenzement ist gebrauchsfertig", "Leo Tolstoi Bücher", "Zeilen trenner hier"],
)
NEWS = (
    ["$10,000 Gold?", "  SAN FRANCISCO – It has never been easy.  "],
    ["Steigt Gold auf 10.000 Dollar?", "SAN FRANCISCO – Es war nie leicht."],
)
DEV = (["Parliament Does Not Support", "A second & last line"], ["Parlament unterstützt", "Zwei"])
TEST_DOCS = [
    ("1012-bbc", [("1", "Gutach: Increased safety for walkers", "Gutach: Mehr Sicherheit")]),
    (
        "1013-bbc",
        [("1", "They are & not even 100 metres", "Sie stehen keine 100 Meter"),
         ("2", "In the summer", "Im Sommer")],
    ),
]  # fmt: skip


def _sgm(side: str, lang: str) -> bytes:
    lines = [f'<refset setid="newstest2014" srclang="any" trglang="{lang}">']
    for doc, segs in TEST_DOCS:
        lines.append(f'<doc sysid="ref" docid="{doc}" genre="news" origlang="en">')
        lines.append("<p>")
        for sid, en, de in segs:
            lines.append(f'<seg id="{sid}">{en if side == "src" else de}</seg>')
        lines.append("</p>")
        lines.append("</doc>")
    lines.append("</refset>")
    return ("\n".join(lines) + "\n").encode()


def _tgz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        d = tarfile.TarInfo(path.stem)
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _lines(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def make_archives(root: Path) -> dict[str, Path]:
    """The five archives, with the member names of the real ones (and distractors)."""
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "europarl": {
            "training/europarl-v7.fr-en.en": b"not this pair\n",
            "training/europarl-v7.de-en.en": _lines(EUROPARL[0]),
            "training/europarl-v7.de-en.de": _lines(EUROPARL[1]),
        },
        "commoncrawl": {
            "commoncrawl.de-en.de": _lines(COMMONCRAWL[1]),
            "commoncrawl.de-en.annotation": b"x\n" * 3,
            "commoncrawl.de-en.en": _lines(COMMONCRAWL[0]),
        },
        "news-commentary": {
            "training/news-commentary-v9.de-en.en": _lines(NEWS[0]),
            "training/news-commentary-v9.de-en.de": _lines(NEWS[1]),
        },
        "dev": {
            "dev/newstest2012.en": b"older\n",
            "dev/newstest2013.en": _lines(DEV[0]),
            "dev/newstest2013.de": _lines(DEV[1]),
        },
        "test": {
            "test-full/newstest2014-deen-src.en.sgm": _sgm("src", "en"),
            "test-full/newstest2014-deen-ref.de.sgm": _sgm("ref", "de"),
            "test-full/newstest2014-deen-src.de.sgm": _sgm("ref", "de"),
        },
    }
    out = {}
    for name, members in files.items():
        path = root / ARCHIVES[name].filename
        _tgz(path, members)
        out[name] = path
    return out


def _read(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\n")[:-1]


def check_corpus(out: Path, stats: dict) -> None:
    en, de = _read(out / "train.en"), _read(out / "train.de")
    assert en == [
        "Resumption of the session",
        "I declare resumed the session.",
        "iron cement is a ready",
        "Leo Tolstoy books",
        "Line separator here",
        "$10,000 Gold?",
        "SAN FRANCISCO – It has never been easy.",
    ]
    assert de[2:5] == [
        "Eisenzement ist gebrauchsfertig",
        "Leo Tolstoi Bücher",
        "Zeilen trenner hier",
    ]
    assert len(de) == len(en)
    assert _read(out / "valid.en") == DEV[0] and _read(out / "valid.de") == DEV[1]
    assert _read(out / "test.en") == [en for _, segs in TEST_DOCS for _, en, _ in segs]
    assert _read(out / "test.de") == [de for _, segs in TEST_DOCS for _, _, de in segs]
    assert stats["splits"] == {"train": 7, "valid": 2, "test": 3}
    assert stats["sources"]["europarl"] == {"raw": 3, "kept": 2, "empty": 1}
    assert stats["filtered"] == {"empty": 1}
    assert json.loads((out / "corpus.json").read_text()) == stats
    assert not (out / ".cache" / "extracted").exists()


def test_build_from_cached_archives_needs_no_network(tmp_path: Path) -> None:
    out = tmp_path / "wmt"
    make_archives(out / ".cache")
    nowhere = {k: Archive(f"http://127.0.0.1:9/{a.filename}") for k, a in ARCHIVES.items()}
    stats = fetch_wmt14_ende(out, archives=nowhere, log=lambda _: None)
    check_corpus(out, stats)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A local HTTP server over a directory of archives; yields its base URL."""
    root = tmp_path / "www"
    make_archives(root)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_download_then_build(tmp_path: Path, server: str) -> None:
    out = tmp_path / "wmt"
    archives = {k: Archive(f"{server}/{a.filename}") for k, a in ARCHIVES.items()}
    lines: list[str] = []
    stats = fetch_wmt14_ende(out, archives=archives, timeout=10, log=lines.append)
    check_corpus(out, stats)
    assert sorted(p.name for p in (out / ".cache").iterdir()) == sorted(
        a.filename for a in ARCHIVES.values()
    )
    assert sum("downloading" in line for line in lines) == 5
    # A second run reuses the cache: nothing is downloaded.
    lines.clear()
    fetch_wmt14_ende(out, archives=archives, timeout=10, log=lines.append)
    assert not any("downloading" in line for line in lines)
    # A missing file on the server is one line naming the URL and the HTTP status.
    missing = {**archives, "dev": Archive(f"{server}/no-such.tgz")}
    with pytest.raises(CorpusUnavailable, match=r"no-such\.tgz: HTTP 404") as info:
        fetch_wmt14_ende(tmp_path / "other", archives=missing, timeout=10, log=lambda _: None)
    assert "\n" not in str(info.value)
    assert not list((tmp_path / "other" / ".cache").glob("*.part"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    port = _closed_port()
    archives = {k: Archive(f"http://127.0.0.1:{port}/{a.filename}") for k, a in ARCHIVES.items()}
    with pytest.raises(CorpusUnavailable) as info:
        fetch_wmt14_ende(tmp_path, archives=archives, timeout=5, log=lambda _: None)
    msg = str(info.value)
    assert "\n" not in msg and "WMT14" in msg and f"127.0.0.1:{port}" in msg
    assert "DIR/.cache/" in msg and "debian-ende" in msg  # what to do instead
    assert not (tmp_path / "train.en").exists()
    assert not list((tmp_path / ".cache").glob("*"))


def test_stalled_server_times_out(tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts connections (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        archives = {"dev": Archive(f"http://127.0.0.1:{port}/dev.tgz")}
        with pytest.raises(CorpusUnavailable, match="timed out") as info:
            fetch_wmt14_ende(tmp_path, archives=archives, timeout=0.5, log=lambda _: None)
    assert "\n" not in str(info.value)


def test_damaged_inputs_are_one_line_errors(tmp_path: Path) -> None:
    out = tmp_path / "wmt"
    paths = make_archives(out / ".cache")
    nowhere = {k: Archive(f"http://127.0.0.1:9/{a.filename}") for k, a in ARCHIVES.items()}
    # Parallel files of different lengths.
    _tgz(
        paths["news-commentary"],
        {
            "training/news-commentary-v9.de-en.en": _lines(NEWS[0]),
            "training/news-commentary-v9.de-en.de": _lines(NEWS[1][:1]),
        },
    )
    with pytest.raises(CorpusUnavailable, match=r"news-commentary-v9\.de-en\.de has 1 lines"):
        fetch_wmt14_ende(out, archives=nowhere, log=lambda _: None)
    assert not (out / "train.en").exists() and not list(out.glob("*.tmp"))
    # A member missing from an archive.
    make_archives(out / ".cache")
    _tgz(paths["dev"], {"dev/newstest2013.en": _lines(DEV[0])})
    with pytest.raises(CorpusUnavailable, match=r"dev\.tgz has no newstest2013\.de"):
        fetch_wmt14_ende(out, archives=nowhere, log=lambda _: None)
    # A truncated archive.
    make_archives(out / ".cache")
    data = paths["test"].read_bytes()
    paths["test"].write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusUnavailable, match=r"test-full\.tgz is damaged") as info:
        fetch_wmt14_ende(out, archives=nowhere, log=lambda _: None)
    assert "\n" not in str(info.value)


def test_sgm_parsing_and_mismatch(tmp_path: Path) -> None:
    src = tmp_path / "src.sgm"
    src.write_bytes(_sgm("src", "en"))
    assert read_sgm(src) == [
        ("1012-bbc", "1", "Gutach: Increased safety for walkers"),
        ("1013-bbc", "1", "They are & not even 100 metres"),
        ("1013-bbc", "2", "In the summer"),
    ]
    out = tmp_path / "wmt"
    paths = make_archives(out / ".cache")
    ref = _sgm("ref", "de").replace(b'<seg id="2">', b'<seg id="3">')
    _tgz(
        paths["test"],
        {
            "test-full/newstest2014-deen-src.en.sgm": _sgm("src", "en"),
            "test-full/newstest2014-deen-ref.de.sgm": ref,
        },
    )
    nowhere = {k: Archive(f"http://127.0.0.1:9/{a.filename}") for k, a in ARCHIVES.items()}
    with pytest.raises(CorpusUnavailable, match="do not match segment for segment"):
        fetch_wmt14_ende(out, archives=nowhere, log=lambda _: None)


def test_cli_fetch_wmt14_from_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wmt"
    make_archives(out / ".cache")
    assert cli_main(["corpus", "fetch", "wmt14-ende", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "wmt14-ende" and printed["splits"]["test"] == 3
    assert _read(out / "valid.de") == DEV[1]
