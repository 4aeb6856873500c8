"""Benchmarks (issue 8): what a job costs the API server, how far one hub scales, and the codec.

``just bench`` runs them all (:mod:`bench.run`) and writes ``docs/benchmarks.md`` with the machine's
description, plus one PNG per series under ``docs/bench/``. Nothing here is a test: no timing is
asserted, numbers are reported as measured, medians of several runs.

:mod:`bench.run` is the command line; :mod:`bench.series` runs each series' sizes and repeats, one
module per benchmark measures a run (``job_cost``, ``diagnosis_cost``, ``hub_capacity``, ``hub_cache``,
``hub_heap``, ``codec``, ``edge_footprint``), :mod:`bench.store` keeps the results and :mod:`bench.report`
writes the page from them.
"""
