"""The summary of py-spy's collapsed stacks that the hub profile keeps (bench/hub_profile.py)."""

from __future__ import annotations

from bench.hub_profile import shorten, summarize

STACKS = "\n".join(
    [
        "run (/x/site-packages/trio/_core/_run.py:10);send_all (/x/site-packages/trio/_highlevel_socket.py:120) 6",
        "run (/x/site-packages/trio/_core/_run.py:10);_read (/repo/roles/cloud/session_handler.py:200) 3",
        "run (/x/site-packages/trio/_core/_run.py:10);labels (/x/site-packages/prometheus_client/metrics.py:1) 1",
        " 40",
    ]
)


def test_shares_are_of_busy_samples_by_innermost_frame_and_by_area() -> None:
    """Self shares go to the innermost frame and its package, inclusive ones to every frame; idle is left out."""
    lines = summarize(STACKS, "burst").splitlines()
    assert "# 10 busy samples (idle left out). Collapsed stacks (py-spy raw format) follow the summary." in lines
    assert "#    60.0%  trio" in lines
    assert "#    30.0%  roles/cloud (the hub)" in lines
    assert "#    10.0%  prometheus_client" in lines
    assert "#    60.0%  send_all (trio/_highlevel_socket.py)" in lines
    assert "#   100.0%  run (trio/_core/_run.py)" in lines
    assert "#    30.0%  _read (roles/cloud/session_handler.py)" in lines


def test_no_samples_says_so() -> None:
    """An empty profile is a summary saying there were no samples, not a division by zero."""
    assert summarize("", "burst").splitlines()[1] == "# no samples"


def test_stored_stacks_name_files_from_their_package_and_keep_line_numbers() -> None:
    """Shortened stacks drop site-packages and checkout paths, keep each line number, and leave idle out."""
    assert shorten(STACKS).splitlines() == [
        "run (trio/_core/_run.py:10);send_all (trio/_highlevel_socket.py:120) 6",
        "run (trio/_core/_run.py:10);_read (roles/cloud/session_handler.py:200) 3",
        "run (trio/_core/_run.py:10);labels (prometheus_client/metrics.py:1) 1",
    ]
