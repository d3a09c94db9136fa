"""A user's mistake: one line on stderr naming it, and exit code 2."""

from __future__ import annotations

import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the user's input, reported as one line and exit code 2."""


def die(message: str) -> int:
    """Print `paperscale: error: MESSAGE` on stderr; returns EXIT_USAGE."""
    print(f"paperscale: error: {message}", file=sys.stderr)
    return EXIT_USAGE
