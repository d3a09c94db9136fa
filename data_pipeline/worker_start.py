"""What the fork server of the loader workers imports once, when it starts
(data_pipeline/loader.py): torch and the producer, so that a worker forked from it starts with
them loaded instead of importing them again. It also holds the stop signals in the server, so
that a worker forked from it holds them from its first instruction until it has installed its
own handlers (worker_signals.ignore_stop_signals), whoever started the server; the server itself
waits out a TERM to every process of a job and ends with its rank."""

from __future__ import annotations

import signal

from data_pipeline import producer  # noqa: F401 -- loaded once, for every worker
from data_pipeline.worker_signals import STOP_SIGNALS

signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
