"""Benchmarks (issue 8): what a job costs the API server, how far one hub scales, and the codec.

``just bench`` runs them all (:mod:`bench.run`) and writes ``docs/benchmarks.md`` with the machine's
description, plus one PNG per series under ``docs/bench/``. Nothing here is a test: no timing is
asserted, numbers are reported as measured, medians of several runs.
"""
