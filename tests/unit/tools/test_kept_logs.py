"""A failed integration test keeps its processes' logs: copied out of its temporary tree, their tails in the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import conftest as integration


def test_a_failed_tests_logs_are_kept_and_their_last_lines_reported(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failing test's ``*.log`` files are copied and their last lines printed; a passing test's are not."""
    kept = tmp_path / "kept"
    monkeypatch.setattr(integration, "KEPT_LOGS", kept)
    pytester.makeconftest("from tests.integration.conftest import pytest_runtest_makereport")
    pytester.makepyfile(
        test_roles="""
        def test_fails(tmp_path):
            (tmp_path / "edge").mkdir()
            (tmp_path / "edge" / "agent.log").write_text("\\n".join(f"agent line {i}" for i in range(100)))
            (tmp_path / "hub-0.log").write_text("hub said 403 Forbidden")
            assert False, "the job did not settle"

        def test_passes(tmp_path):
            (tmp_path / "quiet.log").write_text("nothing to see")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:trio")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "hub said 403 Forbidden" in out
    assert "agent line 99" in out
    assert "agent line 39" not in out  # the last 60 lines only
    (copied,) = [p for p in kept.iterdir() if "test_fails" in p.name]
    assert (copied / "edge" / "agent.log").read_text().startswith("agent line 0")
    assert (copied / "hub-0.log").read_text() == "hub said 403 Forbidden"
    assert not [p for p in kept.iterdir() if "test_passes" in p.name]
    assert "nothing to see" not in out
