"""Benchmarks: each prints its figures for a human and, with --json, writes them as rows that
bench/suite.py collects into bench/RESULTS.md."""
