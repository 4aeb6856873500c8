"""The report: ``docs/benchmarks.md`` and its plots, written from the stored results (``docs/bench/results.json``).

:mod:`bench.report.page` lays the page out; each series has its section, the notes close it and
the plots (matplotlib, when installed) sit beside the tables. Nothing here measures: it reads what
:mod:`bench.run` stored, so ``python -m bench.run --render`` rewrites the page without a cluster.
"""
