"""A private apt: its own config, lists and cache, so fetching never touches the system's state.

The system's apt configuration is copied except files that set ``Acquire::Languages`` (Debian
container images switch translations off), and translations for English and German are asked
for. Only unprivileged subcommands are used (``update`` into private lists, ``download`` into a
chosen directory); nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from data_pipeline.corpus.errors import unavailable

SYSTEM_PARTS = Path("/etc/apt/apt.conf.d")
APT_HELPER = Path("/usr/lib/apt/apt-helper")


def _quote(value: str) -> str:
    """Quote a value for apt.conf syntax."""
    return '"' + value.replace('"', "") + '"'


def _apt_error(stderr: str) -> str | None:
    """The first line of apt's stderr that reports a failure, or None if there is none.

    ``apt-get update`` exits 0 when an index could not be fetched (it only warns), so the
    warnings that mean "nothing came" count as failure here.
    """
    markers = ("E:", "Err:", "W: Failed to fetch", "W: Some index files failed")
    for line in stderr.splitlines():
        if line.strip().startswith(markers):
            return line.strip()
    return None


class PrivateApt:
    """apt-get with lists, cache and config under `root` (e.g. ``DIR/.cache/apt``).

    `sources` (deb822 text) replaces the system's sources list; None keeps the system's sources.
    `options` are extra ``Name "value";`` settings (e.g. ``{"Acquire::Retries": "0"}``).
    """

    def __init__(
        self,
        root: Path,
        *,
        sources: str | None = None,
        options: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.root = Path(root).resolve()
        self.lists = self.root / "lists"
        self.timeout = timeout
        self.config = self.root / "apt.conf"
        self._write_config(sources, options or {})

    def _write_config(self, sources: str | None, options: dict[str, str]) -> None:
        """Create the private directories and write the apt.conf that points at them."""
        parts = self.root / "apt.conf.d"
        for d in (self.lists / "partial", self.root / "cache" / "archives" / "partial", parts):
            d.mkdir(parents=True, exist_ok=True)
        for old in parts.iterdir():
            old.unlink()
        if SYSTEM_PARTS.is_dir():
            for f in sorted(SYSTEM_PARTS.iterdir()):
                if not f.is_file():
                    continue
                try:
                    text = f.read_text(errors="replace")
                except OSError:
                    continue
                if "Languages" in text:
                    continue  # the files that turn translations off
                shutil.copy(f, parts / f.name)
        lines = [
            f"Dir::State::Lists {_quote(str(self.lists))};",
            f"Dir::Cache {_quote(str(self.root / 'cache'))};",
            'Dir::Cache::pkgcache "";',
            'Dir::Cache::srcpkgcache "";',
            f"Dir::Etc::Parts {_quote(str(parts))};",
            'Acquire::Languages { "en"; "de"; };',
            'Acquire::http::Timeout "30";',
            'Acquire::https::Timeout "30";',
        ]
        if sources is not None:
            src_dir = self.root / "sources.list.d"
            src_dir.mkdir(exist_ok=True)
            for old in src_dir.iterdir():
                old.unlink()
            (src_dir / "corpus.sources").write_text(sources)
            lines += [
                f"Dir::Etc::SourceParts {_quote(str(src_dir))};",
                'Dir::Etc::SourceList "/dev/null";',
            ]
        lines += [f"{k} {_quote(v)};" for k, v in options.items()]
        self.config.write_text("\n".join(lines) + "\n")

    def _run(self, args: list[str], what: str, cwd: Path | None = None) -> str:
        """Run an apt command with the private config; raise CorpusUnavailable on failure."""
        env = dict(os.environ, APT_CONFIG=str(self.config), LC_ALL="C")
        try:
            proc = subprocess.run(
                args,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise unavailable(f"{what}: {args[0]} not found, this is not a Debian system") from exc
        except subprocess.TimeoutExpired as exc:
            raise unavailable(f"{what} timed out after {self.timeout:.0f}s") from exc
        error = _apt_error(proc.stderr)
        if proc.returncode != 0 or error:
            raise unavailable(f"{what} failed with exit code {proc.returncode}: {error or ''}")
        return proc.stdout

    def has_lists(self) -> bool:
        """Whether a previous update left German and English translation indexes here."""
        return bool(self.translation_files("de")) and bool(self.translation_files("en"))

    def update(self) -> None:
        """`apt-get update` into the private lists; raise CorpusUnavailable if nothing came."""
        self._run(["apt-get", "update"], "apt-get update")
        if not self.translation_files("de"):
            raise unavailable("apt-get update fetched no Translation-de index")

    def download(self, package: str, dest: Path) -> Path:
        """`apt-get download package` into `dest`; return the path of the .deb."""
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob(f"{package}_*.deb"):
            old.unlink()
        self._run(["apt-get", "download", package], f"apt-get download {package}", cwd=dest)
        debs = sorted(dest.glob(f"{package}_*.deb"))
        if not debs:
            raise unavailable(f"apt-get download {package} left no .deb")
        return debs[-1]

    def translation_files(self, lang: str) -> list[Path]:
        """The private lists' Translation-`lang` indexes (any compression), sorted by name."""
        if not self.lists.is_dir():
            return []
        return sorted(
            p for p in self.lists.iterdir() if f"_i18n_Translation-{lang}" in p.name and p.is_file()
        )

    def cat_file(self, path: Path) -> str:
        """The decompressed text of an index file (apt-helper knows apt's compressions)."""
        if not APT_HELPER.exists():
            raise unavailable(f"{APT_HELPER} not found, this is not a Debian system")
        out = subprocess.run(
            [str(APT_HELPER), "cat-file", str(path)],
            capture_output=True,
            timeout=self.timeout,
            check=False,
        )
        if out.returncode != 0:
            raise unavailable(f"apt-helper cat-file {path.name} failed: {out.stderr[:200]!r}")
        return out.stdout.decode("utf-8", errors="replace")


def extract_deb(deb: Path, dest: Path, timeout: float = 300.0) -> Path:
    """Unpack a .deb's data into `dest` with dpkg-deb (no maintainer scripts, nothing installed)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            ["dpkg-deb", "-x", str(deb), str(dest)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise unavailable("dpkg-deb not found, this is not a Debian system") from exc
    if proc.returncode != 0:
        raise unavailable(f"dpkg-deb -x {deb.name} failed: {proc.stderr.strip()}")
    return dest
