"""An API outage is logged once when it starts and once when it ends, whatever the number of tries between."""

from __future__ import annotations

import structlog
from hypothesis import given
from hypothesis import strategies as st

from roles.kube.retrying import Outage


@given(st.integers(min_value=1, max_value=40))
def test_an_outage_logs_one_warning_then_debug_lines_then_one_recovery(failures: int) -> None:
    """However many tries fail, one warning starts the outage and one api_recovered ends it."""
    with structlog.testing.capture_logs() as logs:
        outage = Outage(structlog.get_logger(), "report_write_retry", initial=0.2, cap=5.0)
        delays = [outage.failed(f"403 Forbidden #{i}") for i in range(failures)]
        outage.recovered()
        outage.recovered()  # nothing failed since: nothing to say
    levels = [(e["event"], e["log_level"]) for e in logs]
    assert levels == [
        ("report_write_retry", "warning"),
        *[("report_write_retry", "debug")] * (failures - 1),
        ("api_recovered", "info"),
    ]
    assert logs[-1]["failures"] == failures
    assert all(0.1 <= d <= 5.0 for d in delays)


def test_the_backoff_grows_during_an_outage_and_starts_over_after_it() -> None:
    """Delays double up to the cap while failures go on; after a recovery the first delay is short again."""
    outage = Outage(structlog.get_logger(), "watch_failed", initial=1.0, cap=8.0)
    ceilings = [outage.failed("x") for _ in range(6)]
    assert ceilings[0] <= 1.0
    assert ceilings[-1] >= 4.0
    outage.recovered()
    assert outage.failed("x") <= 1.0
