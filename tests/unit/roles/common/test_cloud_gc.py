"""The garbage-collector settings of a hub and the benchmark fleet (``roles.common.gc_tuning.tune_gc``)."""

from __future__ import annotations

import gc

from roles.common.gc_tuning import GC_YOUNG_THRESHOLD, tune_gc


def test_a_hub_collects_its_young_generation_less_often_and_leaves_startup_objects_alone() -> None:
    """After tuning, the youngest generation holds GC_YOUNG_THRESHOLD allocations and what existed is frozen."""
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
