"""Host check items decide as KubeEdge's pre-check does, with its texts, and measure the real host."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.edge.checks.checks import CheckResult, Thresholds, decide, measure, run_checks
from roles.edge.checks.readings import DiskReading, MeasureError, Usage

percents = st.floats(min_value=0, max_value=100, allow_nan=False)
DEFAULT = Thresholds()


def usage(cpu: float = 10.0, mem: float = 10.0, disks: tuple[tuple[str, float], ...] = (("/", 10.0),)) -> Usage:
    return Usage(cpu=cpu, mem=mem, disks=tuple(DiskReading(path=p, percent=v) for p, v in disks))


@given(reading=percents, limit=percents, item=st.sampled_from(["cpu", "mem", "disk"]))
def test_an_item_fails_only_strictly_above_its_threshold_with_kubeedges_text(
    reading: float, limit: float, item: str
) -> None:
    """Usage above the threshold fails with KubeEdge's exact text; usage at or below it passes."""
    measured = usage(cpu=reading, mem=reading, disks=(("/", reading),))
    result = decide([item], measured, Thresholds(cpu=limit, mem=limit, disk=limit))
    if reading > limit:
        expected = f"current {item} usage is {reading:.2f}, which exceeds the maximum allowed usage {limit:.2f}"
        assert result == CheckResult(ok=False, reason=expected)
    else:
        assert result == CheckResult(ok=True)


@pytest.mark.parametrize("item", ["cpu", "mem", "disk"])
def test_the_threshold_itself_passes(item: str) -> None:
    """KubeEdge compares with ``>``: exactly 80% is accepted, the next float above it is not."""
    assert decide([item], usage(cpu=80.0, mem=80.0, disks=(("/", 80.0),)), DEFAULT).ok
    above = 80.00000000000001
    result = decide([item], usage(cpu=above, mem=above, disks=(("/", above),)), DEFAULT)
    assert result.reason == f"current {item} usage is 80.00, which exceeds the maximum allowed usage 80.00"


def test_texts_round_like_gos_percent_2f() -> None:
    """Values print with two decimals, ties on the exact binary value rounding to even, as Go's fmt does."""
    assert decide(["cpu"], usage(cpu=80.125), DEFAULT).reason.startswith("current cpu usage is 80.12,")
    assert decide(["mem"], usage(mem=99.999), DEFAULT).reason.startswith("current mem usage is 100.00,")
    assert decide(["cpu"], usage(cpu=91.5), Thresholds(cpu=85.5)).reason.endswith("maximum allowed usage 85.50")


@given(
    items=st.lists(st.sampled_from(["cpu", "mem", "disk"]), max_size=5),
    cpu=percents,
    mem=percents,
    disk=percents,
)
def test_the_first_failing_item_in_order_decides(items: list[str], cpu: float, mem: float, disk: float) -> None:
    """Items are checked in the order given; the result is the first failure, or ok if none fails."""
    measured = usage(cpu=cpu, mem=mem, disks=(("/", disk),))
    failing = [i for i in items if {"cpu": cpu, "mem": mem, "disk": disk}[i] > 80]
    result = decide(items, measured, DEFAULT)
    assert result.ok == (not failing)
    if failing:
        assert result.reason.startswith(f"current {failing[0]} usage is ")


@given(before=st.lists(st.sampled_from(["cpu", "mem", "disk"]), max_size=3), after=st.lists(st.text(), max_size=3))
def test_an_unknown_item_fails_with_kubeedges_text_and_stops_the_checks(before: list[str], after: list[str]) -> None:
    """An unknown item fails as "check item X not support"; items after it are never looked at."""
    measured = Usage(cpu=1.0, mem=1.0, disks=(DiskReading(path="/", percent=1.0),))
    result = decide([*before, "gpu", *after], measured, DEFAULT)
    assert result == CheckResult(ok=False, reason="check item gpu not support")


def test_an_unknown_item_after_a_failing_one_is_not_reached() -> None:
    """KubeEdge returns the first error, so a failing cpu before an unknown item wins."""
    assert decide(["cpu", "gpu"], usage(cpu=95.0), DEFAULT).reason.startswith("current cpu usage is 95.00")


def test_readings_that_could_not_be_taken_fail_with_kubeedges_texts() -> None:
    """A missing reading fails its item with KubeEdge's "failed to get ..." text and the error."""
    broken = Usage(
        cpu=MeasureError("no /proc/stat"),
        mem=MeasureError("no /proc/meminfo"),
        disks=(DiskReading(path="/", percent=MeasureError("EIO")),),
    )
    assert decide(["cpu"], broken, DEFAULT).reason == "failed to get cpu usage, err: no /proc/stat"
    assert decide(["mem"], broken, DEFAULT).reason == "failed to get virtual memory stat, err: no /proc/meminfo"
    assert decide(["disk"], broken, DEFAULT).reason == "failed to get disk usage, err: EIO"


def test_disk_checks_the_root_then_the_data_directory() -> None:
    """``/`` keeps KubeEdge's text; a full data directory on another filesystem fails naming its path."""
    both = (("/", 50.0), ("/var/lib/nodetaskd", 93.456))
    assert decide(["disk"], usage(disks=both), DEFAULT).reason == (
        "current disk usage of /var/lib/nodetaskd is 93.46, which exceeds the maximum allowed usage 80.00"
    )
    both_full = (("/", 81.0), ("/var/lib/nodetaskd", 99.0))
    assert decide(["disk"], usage(disks=both_full), DEFAULT).reason.startswith("current disk usage is 81.00,")


def test_an_item_that_was_not_measured_is_a_caller_bug() -> None:
    """Deciding on an item the shell did not measure raises instead of passing silently."""
    with pytest.raises(ValueError, match="disk usage was not measured"):
        decide(["disk"], Usage(cpu=1.0), DEFAULT)
    with pytest.raises(ValueError, match="mem usage was not measured"):
        decide(["mem"], Usage(cpu=1.0), DEFAULT)


@pytest.mark.parametrize("bad", [-0.1, 100.5, float("nan")])
def test_thresholds_outside_0_to_100_are_rejected(bad: float) -> None:
    """A threshold that is not a percentage is refused when the thresholds are made."""
    with pytest.raises(ValueError, match="the disk threshold must lie in"):
        Thresholds(disk=bad)


async def test_the_real_host_measures_in_range(tmp_path: Path) -> None:
    """On this machine every reading is a percentage, ``/`` comes first, and 100% thresholds pass."""
    measured = await measure(["cpu", "mem", "disk"], data_dir=tmp_path, cpu_interval=0.05)
    readings = [measured.cpu, measured.mem, *(d.percent for d in measured.disks)]
    assert all(isinstance(r, float) and 0 <= r <= 100 for r in readings), readings
    assert measured.disks[0].path == "/"
    assert 1 <= len(measured.disks) <= 2
    passed = await run_checks(
        ["cpu", "mem", "disk"], data_dir=tmp_path, thresholds=Thresholds(100, 100, 100), cpu_interval=0.05
    )
    assert passed == CheckResult(ok=True)
    failed = await run_checks(["mem"], data_dir=tmp_path, thresholds=Thresholds(mem=0), cpu_interval=0.05)
    assert failed.reason.startswith("current mem usage is ")
    assert failed.reason.endswith(", which exceeds the maximum allowed usage 0.00")


async def test_the_shell_reports_a_missing_data_directory_and_skips_unknown_items(tmp_path: Path) -> None:
    """A data directory that does not exist fails ``disk``; nothing is measured for or after an unknown item."""
    missing = tmp_path / "nope"
    result = await run_checks(["disk"], data_dir=missing, thresholds=DEFAULT)
    assert result.reason == f"failed to get disk usage, err: [Errno 2] No such file or directory: '{missing}'"
    assert await measure(["gpu", "cpu"], data_dir=tmp_path) == Usage()
    assert await run_checks(["gpu", "cpu"], data_dir=tmp_path, thresholds=DEFAULT) == CheckResult(
        ok=False, reason="check item gpu not support"
    )
