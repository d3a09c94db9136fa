"""The one error the corpus builders raise on purpose."""

from __future__ import annotations


class CorpusUnavailable(Exception):
    """A corpus source (the Debian archive, a statmt.org archive, a file in one) could not be
    reached or read.

    The message is always a single line that names the alternatives, so a CLI can print it as is.
    """


def unavailable(reason: str) -> CorpusUnavailable:
    """Build a `CorpusUnavailable` with a one-line message that points to the alternatives."""
    reason = " ".join(reason.split())
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return CorpusUnavailable(
        f"cannot fetch the Debian English-German corpus ({reason}); "
        "run `paperscale corpus synthetic DIR` for a synthetic corpus, or bring your own "
        "line-aligned parallel files DIR/train.en DIR/train.de DIR/valid.en DIR/valid.de "
        "DIR/test.en DIR/test.de and run `paperscale prepare`"
    )
