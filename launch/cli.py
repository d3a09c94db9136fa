"""`paperscale`: the one command users type.

Every subcommand validates its arguments first; a bad value is one line on stderr naming it and
exit code 2, before any process group or run directory exists. The parser is in
launch/parser.py, the subcommands in launch/cmd_*.py.
"""

from __future__ import annotations

import sys

from launch.config import ConfigError
from launch.parser import build_parser
from launch.usage import EXIT_USAGE, UsageError, die

__all__ = ["EXIT_USAGE", "UsageError", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, UsageError) as exc:
        return die(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
