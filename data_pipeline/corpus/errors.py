"""The one error the corpus builders raise on purpose."""

from __future__ import annotations


class CorpusUnavailable(Exception):
    """A corpus source (the Debian archive, a statmt.org archive, a file in one) could not be
    reached or read.

    The message is always a single line that names the alternatives, so a CLI can print it as is.
    """


def one_line(reason: str, limit: int = 300) -> str:
    """A tool's error output as one line of at most `limit` characters, for the user's message."""
    reason = " ".join(reason.split())
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def unavailable(reason: str) -> CorpusUnavailable:
    """Build a `CorpusUnavailable` with a one-line message that points to the alternatives."""
    reason = one_line(reason)
    return CorpusUnavailable(
        f"cannot fetch the Debian English-German corpus ({reason}); "
        "run `paperscale corpus synthetic DIR` for a synthetic corpus, or bring your own "
        "line-aligned parallel files DIR/train.en DIR/train.de DIR/valid.en DIR/valid.de "
        "DIR/test.en DIR/test.de and run `paperscale prepare`"
    )
