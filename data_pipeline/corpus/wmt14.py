"""`fetch_wmt14_ende`: the WMT14 English-German task the paper trains and tests on.

Training (about 4.5M pairs): Europarl v7, Common Crawl and News Commentary v9; validation:
newstest2013 (3000 pairs); test: newstest2014 as released in ``test-full`` (3003 pairs, the
SGML files with ``<seg id="N">`` lines that sacreBLEU's ``wmt14/full`` uses).  The archives are
the standard ones from statmt.org (:data:`ARCHIVES`); each is downloaded once into
``DIR/.cache/`` (with a timeout, to a temporary name renamed when complete).  A machine without
internet can copy the five ``.tgz`` files into ``DIR/.cache/`` by hand: present archives are not
downloaded again.

Output, like the Debian corpus: line-aligned UTF-8 ``DIR/{train,valid,test}.{en,de}`` and
``DIR/corpus.json``.  Training lines are read as bytes and split on ``\\n`` only (a stray ``\\r``
or U+2028 inside a Common Crawl line must not shift the alignment), whitespace runs become one
space, and pairs with an empty side are dropped and counted; length and ratio filtering is left
to ``paperscale prepare``.  Valid/test lines are kept as they are (stripped), in order, so they
stay aligned with the official references.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from data_pipeline.corpus.errors import CorpusUnavailable, one_line

SRC, TGT = "en", "de"


@dataclass(frozen=True)
class Archive:
    """One statmt.org archive: where it lives and the name it is cached under."""

    url: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


ARCHIVES: dict[str, Archive] = {
    "europarl": Archive("http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"),
    "commoncrawl": Archive("http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz"),
    "news-commentary": Archive("http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz"),
    "dev": Archive("http://www.statmt.org/wmt14/dev.tgz"),
    "test": Archive("http://www.statmt.org/wmt14/test-full.tgz"),
}

# Training corpora: archive -> file stem inside it (``<stem>.en`` / ``<stem>.de``).
TRAIN_STEMS = {
    "europarl": "europarl-v7.de-en",
    "commoncrawl": "commoncrawl.de-en",
    "news-commentary": "news-commentary-v9.de-en",
}
VALID_STEM = "newstest2013"  # dev/newstest2013.en, dev/newstest2013.de
TEST_SRC = "newstest2014-deen-src.en.sgm"  # test-full/...
TEST_REF = "newstest2014-deen-ref.de.sgm"

_SEG = re.compile(rb"<seg\b[^>]*?\bid\s*=\s*\"?([^\"\s>]+)\"?[^>]*>(.*?)</seg>", re.IGNORECASE)
_DOC = re.compile(rb"<doc\b[^>]*?\bdocid\s*=\s*\"?([^\"\s>]+)\"?", re.IGNORECASE)


def unavailable(reason: str) -> CorpusUnavailable:
    """A `CorpusUnavailable` with one line: what failed, and what to do instead."""
    reason = one_line(reason)
    return CorpusUnavailable(
        f"cannot fetch the WMT14 English-German corpus ({reason}); copy the statmt.org "
        f"archives ({', '.join(a.filename for a in ARCHIVES.values())}) into DIR/.cache/ and "
        "run again, or use `paperscale corpus fetch debian-ende DIR`"
    )


# --------------------------------------------------------------------------------------------
# Download


def download(url: str, dest: Path, *, timeout: float, log: Callable[[str], None]) -> Path:
    """Fetch ``url`` to ``dest`` (via ``dest.part``, renamed when complete); return ``dest``.

    Any network failure (no route, DNS, refused, HTTP error, a stall longer than ``timeout``
    seconds, a short body) raises `CorpusUnavailable` with a one-line message.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    log(f"downloading {url} ...")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            expected = resp.headers.get("Content-Length")
            shutil.copyfileobj(resp, out, 1 << 20)
            got = out.tell()
        if expected is not None and expected.isdigit() and int(expected) != got:
            raise unavailable(f"{url}: got {got} of {expected} bytes")
    except urllib.error.HTTPError as exc:
        part.unlink(missing_ok=True)
        raise unavailable(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        part.unlink(missing_ok=True)
        raise unavailable(f"{url}: {exc.reason}") from None
    except TimeoutError as exc:
        part.unlink(missing_ok=True)
        raise unavailable(f"{url}: timed out after {timeout:.0f}s ({exc})") from None
    except CorpusUnavailable:
        part.unlink(missing_ok=True)
        raise
    except (OSError, http.client.HTTPException) as exc:  # reset, incomplete read, ...
        part.unlink(missing_ok=True)
        raise unavailable(f"{url}: {type(exc).__name__}: {exc}") from None
    os.replace(part, dest)
    log(f"  {dest.name}: {got / 1e6:.1f} MB in {time.monotonic() - started:.0f}s")
    return dest


def fetch_archives(
    cache: Path,
    *,
    archives: dict[str, Archive] = ARCHIVES,
    timeout: float = 60.0,
    refresh: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Local paths of every archive, downloading the ones not cached yet (all, on ``refresh``)."""
    out: dict[str, Path] = {}
    for name, arc in archives.items():
        path = cache / arc.filename
        if refresh or not path.is_file():
            download(arc.url, path, timeout=timeout, log=log)
        out[name] = path
    return out


# --------------------------------------------------------------------------------------------
# Reading the archives


def extract_members(archive: Path, basenames: list[str], dest: Path) -> dict[str, Path]:
    """Copy the members of a ``.tgz`` whose base names are in ``basenames`` to ``dest``.

    Only those regular files are written, under their base name (never the archive's paths),
    in one sequential pass.  `CorpusUnavailable` if the archive is damaged or lacks one.
    """
    dest.mkdir(parents=True, exist_ok=True)
    want = set(basenames)
    found: dict[str, Path] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if base not in want or base in found or not member.isfile():
                    continue
                src = tar.extractfile(member)
                assert src is not None
                tmp = dest / (base + ".part")
                with src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(tmp, dest / base)
                found[base] = dest / base
                if len(found) == len(want):
                    break
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise unavailable(f"{archive.name} is damaged ({exc}); delete it and run again") from None
    missing = sorted(want - set(found))
    if missing:
        raise unavailable(f"{archive.name} has no {', '.join(missing)}")
    return found


def _lines(f: BinaryIO) -> Iterator[bytes]:
    """Lines split on ``\\n`` only (not on ``\\r``, U+2028, ...), without the ``\\n``."""
    for line in f:
        yield line[:-1] if line.endswith(b"\n") else line


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace")


def read_parallel(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """``(src, tgt)`` lines of two line-aligned files; `CorpusUnavailable` if counts differ."""
    with open(src, "rb") as fs, open(tgt, "rb") as ft:
        a, b = _lines(fs), _lines(ft)
        n = 0
        for la in a:
            lb = next(b, None)
            if lb is None:
                raise unavailable(f"{tgt.name} has {n} lines but {src.name} has more")
            n += 1
            yield _text(la), _text(lb)
        if next(b, None) is not None:
            raise unavailable(f"{src.name} has {n} lines but {tgt.name} has more")


def read_sgm(path: Path) -> list[tuple[str, str, str]]:
    """``(docid, seg id, text)`` of every ``<seg>`` of a WMT SGML file, in file order.

    The text is what sacreBLEU takes from such a file: the content between the tags,
    stripped, with no entity decoding.
    """
    segs: list[tuple[str, str, str]] = []
    doc = ""
    with open(path, "rb") as f:
        for line in _lines(f):
            m = _DOC.search(line)
            if m:
                doc = _text(m.group(1))
            for seg in _SEG.finditer(line):
                segs.append((doc, _text(seg.group(1)), _text(seg.group(2)).strip()))
    if not segs:
        raise unavailable(f"{path.name}: no <seg> lines")
    return segs


def align_sgm(src: Path, ref: Path) -> list[tuple[str, str]]:
    """Pairs of the source and reference SGML files, matched by (document, segment id)."""
    a, b = read_sgm(src), read_sgm(ref)
    refs = {(d, i): t for d, i, t in b}
    if len(refs) != len(b) or len(a) != len(b) or any((d, i) not in refs for d, i, _ in a):
        raise unavailable(
            f"{src.name} ({len(a)} segments) and {ref.name} ({len(b)}) do not match segment "
            "for segment"
        )
    return [(t, refs[(d, i)]) for d, i, t in a]


# --------------------------------------------------------------------------------------------
# Assembly


def _normalise(text: str) -> str:
    return " ".join(text.split())


class _PairWriter:
    """Writes ``{split}.en``/``{split}.de`` under temporary names; ``commit`` renames them."""

    def __init__(self, out_dir: Path, split: str) -> None:
        self.paths = [out_dir / f"{split}.{lang}" for lang in (SRC, TGT)]
        self.tmps = [p.with_name(p.name + ".tmp") for p in self.paths]
        self.files = [open(t, "w", encoding="utf-8", newline="\n") for t in self.tmps]  # noqa: SIM115
        self.count = 0

    def write(self, src: str, tgt: str) -> None:
        self.files[0].write(src + "\n")
        self.files[1].write(tgt + "\n")
        self.count += 1

    def commit(self) -> int:
        for f in self.files:
            f.close()
        for tmp, path in zip(self.tmps, self.paths, strict=True):
            os.replace(tmp, path)
        return self.count

    def abort(self) -> None:
        for f in self.files:
            f.close()
        for tmp in self.tmps:
            tmp.unlink(missing_ok=True)


def build_wmt14_ende(
    archives: dict[str, Path], out_dir: Path, *, log: Callable[[str], None] = print
) -> dict:
    """Assemble ``out_dir/{train,valid,test}.{en,de}`` + ``corpus.json`` from local archives.

    ``archives`` maps the names of :data:`ARCHIVES` to ``.tgz`` paths.  Returns the stats
    written to ``corpus.json``.
    """
    out_dir = Path(out_dir)
    work = out_dir / ".cache" / "extracted"
    sources: dict[str, dict[str, int]] = {}
    writer = _PairWriter(out_dir, "train")
    try:
        for name, stem in TRAIN_STEMS.items():
            files = extract_members(archives[name], [f"{stem}.{SRC}", f"{stem}.{TGT}"], work)
            raw = kept = 0
            for src, tgt in read_parallel(files[f"{stem}.{SRC}"], files[f"{stem}.{TGT}"]):
                raw += 1
                src, tgt = _normalise(src), _normalise(tgt)
                if src and tgt:
                    writer.write(src, tgt)
                    kept += 1
            sources[name] = {"raw": raw, "kept": kept, "empty": raw - kept}
            log(f"{name}: {kept} pairs of {raw} lines ({stem}.{SRC}/.{TGT})")
            for f in files.values():
                f.unlink()
        n_train = writer.commit()
    except BaseException:
        writer.abort()
        raise
    dev = extract_members(archives["dev"], [f"{VALID_STEM}.{SRC}", f"{VALID_STEM}.{TGT}"], work)
    valid = [
        (a.strip(), b.strip())
        for a, b in read_parallel(dev[f"{VALID_STEM}.{SRC}"], dev[f"{VALID_STEM}.{TGT}"])
    ]
    test_files = extract_members(archives["test"], [TEST_SRC, TEST_REF], work)
    test = align_sgm(test_files[TEST_SRC], test_files[TEST_REF])
    counts = {"train": n_train}
    for split, pairs in (("valid", valid), ("test", test)):
        w = _PairWriter(out_dir, split)
        for a, b in pairs:
            w.write(a, b)
        counts[split] = w.commit()
    shutil.rmtree(work, ignore_errors=True)
    log(f"wmt14-ende: train {counts['train']}, valid {counts['valid']}, test {counts['test']}")
    stats = {
        "kind": "wmt14-ende",
        "direction": f"{SRC}-{TGT}",
        "splits": counts,
        "sources": sources,
        "valid": f"dev/{VALID_STEM}.{SRC}/.{TGT}",
        "test": f"test-full/{TEST_SRC} + {TEST_REF}",
        "filtered": {"empty": sum(s["empty"] for s in sources.values())},
        "archives": {k: a.url for k, a in ARCHIVES.items()},
    }
    (out_dir / "corpus.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def fetch_wmt14_ende(
    out_dir: Path,
    *,
    timeout: float = 60.0,
    refresh: bool = False,
    archives: dict[str, Archive] = ARCHIVES,
    log: Callable[[str], None] = print,
) -> dict:
    """Download (or reuse from ``out_dir/.cache``) the WMT14 archives and build the corpus.

    Raises `CorpusUnavailable` (one line) when an archive cannot be fetched or read.
    ``archives`` replaces the statmt.org URLs (tests serve them from a local server).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = fetch_archives(
        out_dir / ".cache", archives=archives, timeout=timeout, refresh=refresh, log=log
    )
    return build_wmt14_ende(paths, out_dir, log=log)
