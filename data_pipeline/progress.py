"""Progress bars of `prepare`: tqdm over input bytes on a TTY, nothing otherwise."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(enabled: bool | None, total: int, desc: str) -> Any:
    """A tqdm bar over input bytes (ETA included) on a TTY; a no-op object otherwise."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        enabled = False
    if not enabled:

        class _Null:
            def update(self, n: int) -> None:
                pass

            def close(self) -> None:
                pass

        return _Null()
    # No monitor thread: encoder processes are forked later, and forking with threads is unsafe.
    tqdm.monitor_interval = 0
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, dynamic_ncols=True)
