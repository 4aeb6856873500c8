"""What ``nodetaskd ctl`` shows comes from API objects through pure functions: counts, rows, watch ends."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from roles.cli.ctl.follow import WatchState, on_event, on_job, outcome
from roles.cli.ctl.live import LiveView, render
from roles.cli.ctl.text import job_names, jobs_table, progress_line, table
from roles.cli.ctl.views import (
    EventRow,
    JobSummary,
    age,
    confirm_value,
    edge_rows,
    find_kind,
    node_rows,
    paused_for_confirmation,
    retry_value,
    summarize,
    target_of,
)
from schemas.core import AGENT_VERSION_ANNOTATION, EDGE_ROLE_LABEL, HUB_ANNOTATION, Node, NodeCondition, NodeStatus
from schemas.kinds import CONFIG_UPDATE_JOB, IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from schemas.v1alpha2 import (
    ActionStatus,
    ConfigUpdateJobSpec,
    ImagePrePullJobSpec,
    ImagePrePullTemplate,
    NodeComponent,
    NodeCounts,
    NodeUpgradeJob,
    NodeUpgradeJobNodeTaskStatus,
    NodeUpgradeJobSpec,
    NodeUpgradeJobStatus,
)

NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), max_size=6)


def _entry(
    node: str, phase: NodeTaskPhase, *actions: tuple[str, ConditionStatus], reason: str = ""
) -> NodeUpgradeJobNodeTaskStatus:
    flow = tuple(ActionStatus(action=a, status=s) for a, s in actions)
    return NodeUpgradeJobNodeTaskStatus(node_name=node, phase=phase, action_flow=flow, reason=reason)


def _job(
    *entries: NodeUpgradeJobNodeTaskStatus, counts: NodeCounts | None = None, phase: JobPhase = JobPhase.IN_PROGRESS
) -> NodeUpgradeJob:
    status = NodeUpgradeJobStatus(phase=phase, node_status=entries, node_counts=counts)
    return NodeUpgradeJob(metadata=ObjectMeta(name="upgrade"), status=status)


def _node(name: str, *, edge: bool = True, hub: str = "", version: str = "", ready: bool = True) -> Node:
    annotations = {k: v for k, v in ((HUB_ANNOTATION, hub), (AGENT_VERSION_ANNOTATION, version)) if v}
    labels = {EDGE_ROLE_LABEL: ""} if edge else {}
    status = NodeStatus(conditions=(NodeCondition(type="Ready", status="True" if ready else "False"),))
    return Node(metadata=ObjectMeta(name=name, labels=labels, annotations=annotations), status=status)


def test_counts_come_from_node_counts_or_are_counted_from_the_node_entries() -> None:
    """The controller's nodeCounts win; without them the entries are counted per phase (no phase yet: pending)."""
    written = NodeCounts(total=5, pending=1, in_progress=1, successful=2, failure=1, unknown=0)
    assert summarize(NODE_UPGRADE_JOB, _job(counts=written)).counts == {
        "pending": 1,
        "inProgress": 1,
        "successful": 2,
        "failure": 1,
        "unknown": 0,
    }
    counted = summarize(
        NODE_UPGRADE_JOB,
        _job(
            _entry("a", NodeTaskPhase.NONE), _entry("b", NodeTaskPhase.SUCCESSFUL), _entry("c", NodeTaskPhase.UNKNOWN)
        ),
    )
    assert (counted.total, counted.counts["pending"], counted.counts["successful"], counted.ended) == (3, 1, 1, 2)


def test_node_rows_carry_the_last_action_and_the_hub_and_version_recorded_on_each_node() -> None:
    """Each node's row shows its last action and reason, and what the hubs wrote on its Node (or nothing)."""
    job = _job(
        _entry(
            "a",
            NodeTaskPhase.FAILURE,
            ("Check", ConditionStatus.TRUE),
            ("BackUp", ConditionStatus.FALSE),
            reason="no launcher",
        ),
        _entry("b", NodeTaskPhase.NONE),
    )
    rows = node_rows(job, {"a": _node("a", hub="hub-0", version="v0.1.0")})
    assert [(r.node, r.phase, r.last_action, r.last_action_status, r.reason, r.hub, r.agent_version) for r in rows] == [
        ("a", "Failure", "BackUp", "False", "no launcher", "hub-0", "v0.1.0"),
        ("b", "Pending", "", "", "", "", ""),
    ]


def test_edge_rows_list_edge_nodes_only_and_say_which_are_connected() -> None:
    """A Node is an edge by KubeEdge's label; it is connected while a hub's annotation names it."""
    rows = edge_rows([_node("z", hub="hub-1", version="v0.2.0"), _node("a", ready=False), _node("cloud", edge=False)])
    assert [(r.name, r.connected, r.hub, r.agent_version, r.ready) for r in rows] == [
        ("a", False, "", "", False),
        ("z", True, "hub-1", "v0.2.0", True),
    ]


def test_nodes_paused_at_waiting_confirmation_are_found() -> None:
    """Only a node in progress whose last reported action is a successful WaitingConfirmation is paused."""
    job = _job(
        _entry(
            "paused",
            NodeTaskPhase.IN_PROGRESS,
            ("Check", ConditionStatus.TRUE),
            ("WaitingConfirmation", ConditionStatus.TRUE),
        ),
        _entry("checking", NodeTaskPhase.IN_PROGRESS, ("Check", ConditionStatus.TRUE)),
        _entry("done", NodeTaskPhase.SUCCESSFUL, ("WaitingConfirmation", ConditionStatus.TRUE)),
    )
    assert paused_for_confirmation(job) == ["paused"]


@given(current=NAMES, added=NAMES, every=st.booleans())
def test_confirming_only_ever_adds_nodes_and_star_releases_all(
    current: list[str], added: list[str], every: bool
) -> None:
    """The new annotation keeps every node released before, adds the new ones, is sorted, and `*` absorbs everything."""
    value = confirm_value(",".join(current), added, every=every)
    if every:
        assert value == "*"
        return
    assert value == ",".join(sorted(set(current) | set(added)))
    assert confirm_value(value, added, every=False) == value  # confirming again changes nothing
    assert confirm_value("*", added, every=False) == "*"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("nodeupgradejob", NODE_UPGRADE_JOB),
        ("NodeUpgradeJobs", NODE_UPGRADE_JOB),
        ("ippj", IMAGE_PRE_PULL_JOB),
        ("cuj", CONFIG_UPDATE_JOB),
    ],
)
def test_a_kind_is_found_by_any_of_its_names(text: str, kind: object) -> None:
    """Plural, singular, kind and short names all name the kind, in any case."""
    assert find_kind(text) is kind


def test_an_unknown_kind_is_refused_naming_the_known_ones() -> None:
    """A typo gets the list of names that work."""
    with pytest.raises(ValueError, match=r"'nodejob' is not a node job kind .*nodeupgradejob"):
        find_kind("nodejob")


def test_ages_read_as_kubectl_prints_them() -> None:
    """Seconds, then minutes, hours and days; no time is '-'."""
    now = datetime(2026, 1, 10, 12, 0, 0, tzinfo=UTC)
    assert [
        age(t, now)
        for t in ("2026-01-10T11:59:18Z", "2026-01-10T11:30:00Z", "2026-01-10T06:00:00Z", "2026-01-01T12:00:00Z", "")
    ] == [
        "42s",
        "30m",
        "6h",
        "9d",
        "-",
    ]


def _summary(phase: str, **counts: int) -> JobSummary:
    return JobSummary(kind="nodeupgradejob", name="u", phase=phase, total=sum(counts.values()), counts=counts)


def test_a_watch_ends_when_every_job_is_final_with_0_only_if_all_completed() -> None:
    """None while any job runs or has not been seen; 0 when all Completed; 1 when one failed or was deleted."""
    state = WatchState.start(["a", "b"])
    assert outcome(state) is None
    state, _ = on_job(state, "a", _summary("Completed", successful=2))
    assert outcome(state) is None
    done, _ = on_job(state, "b", _summary("Completed", successful=1))
    assert outcome(done) == 0
    failed, _ = on_job(state, "b", _summary("Failure", failure=1))
    assert outcome(failed) == 1
    deleted, changed = on_job(state, "b", None)
    assert (outcome(deleted), changed) == (1, True)


def test_only_a_visible_change_of_a_job_counts_as_a_change() -> None:
    """A new resourceVersion with the same phase and counts prints nothing; another count does."""
    state, first = on_job(WatchState.start(["a"]), "a", _summary("InProgress", pending=2))
    state, same = on_job(state, "a", _summary("InProgress", pending=2))
    state, moved = on_job(state, "a", _summary("InProgress", pending=1, inProgress=1))
    assert (first, same, moved) == (True, False, True)


def test_an_event_is_reported_once_per_occurrence() -> None:
    """The same Event again (a relist) is not new; its count going up is."""
    row = EventRow(time="2026-01-10T12:00:00Z", type="Normal", reason="Started", message="m", object="nodeupgradejob/u")
    state, new = on_event(WatchState.start(["a"]), "u.1", row)
    state, again = on_event(state, "u.1", row)
    state, repeated = on_event(state, "u.1", msgspec.structs.replace(row, count=2))
    assert (new, again, repeated) == (True, False, True)
    assert len(state.events) == 2


def test_tables_align_columns_and_lines_say_everything_on_one_line() -> None:
    """Columns start at the same offset on every line; a progress line holds the phase and every count."""
    assert table(("A", "LONGER"), [["xxxx", "1"], ["y", "22"]]) == "A      LONGER\nxxxx   1\ny      22\n"
    line = progress_line(_summary("InProgress", pending=1, inProgress=2), when="T")
    assert line == "T nodeupgradejob/u phase=InProgress nodes=3 pending=1 inProgress=2 successful=0 failure=0 unknown=0"
    text = jobs_table([_summary("Completed", successful=3)], now=datetime(2026, 1, 1, tzinfo=UTC))
    assert text.splitlines()[1].split() == ["nodeupgradejob", "u", "Completed", "3", "0", "0", "3", "0", "0", "-"]


def test_the_wide_table_says_what_each_job_does_and_why_it_is_where_it_is() -> None:
    """``-o wide`` adds TARGET (component and version, images, fields) and REASON ("-" when there is none)."""
    upgrade = NodeUpgradeJobSpec(version="v1.20.3", component=NodeComponent.KUBELET)
    prepull = ImagePrePullJobSpec(image_pre_pull_template=ImagePrePullTemplate(images=("a:1", "b:2")))
    config = ConfigUpdateJobSpec(update_fields={"maxPods": "42", "evictionHard": "memory.available<1Mi"})
    assert [target_of(spec) for spec in (upgrade, NodeUpgradeJobSpec(version="v0.2.0"), prepull, config)] == [
        "kubelet v1.20.3",
        "nodetaskd v0.2.0",
        "2 images: a:1, b:2",
        "nodetaskd: evictionHard, maxPods",
    ]
    failed = msgspec.structs.replace(_summary("Failure", failure=1), reason="1/1 failed", target="kubelet v1.20.3")
    rows = jobs_table([failed, _summary("Completed")], now=datetime(2026, 1, 1, tzinfo=UTC), wide=True).splitlines()
    assert rows[0].split()[-3:] == ["AGE", "TARGET", "REASON"]
    assert rows[1].endswith("kubelet v1.20.3   1/1 failed")
    assert rows[2].split()[-2:] == ["-", "-"]


def test_the_live_view_draws_a_bar_and_the_counts_per_job_and_the_latest_events() -> None:
    """The terminal view holds each job with its ended/total, its counts and the latest Events."""
    state, _ = on_job(
        WatchState.start(["nodeupgradejob/u"]), "nodeupgradejob/u", _summary("InProgress", successful=1, inProgress=3)
    )
    row = EventRow(
        time="12:00", type="Warning", reason="NodeTimedOut", message="edge-3 went silent", object="nodeupgradejob/u"
    )
    state, _ = on_event(state, "u.1", row)
    console = Console(record=True, width=140, force_terminal=False)
    console.print(render(state))
    shown = console.export_text()
    assert "nodeupgradejob/u" in shown
    assert "InProgress" in shown
    assert "1/4" in shown
    assert "NodeTimedOut" in shown
    assert "edge-3 went silent" in shown


def test_the_live_view_redraws_on_each_change_and_leaves_the_last_frame() -> None:
    """On a terminal every change redraws the view in place; the final phase is what stays on screen."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    state = WatchState.start(["nodeupgradejob/u"])
    with LiveView(console) as view:
        for summary in (_summary("InProgress", pending=2), _summary("Completed", successful=2)):
            state, _ = on_job(state, "nodeupgradejob/u", summary)
            view.job(state, summary)
    shown = out.getvalue()
    assert shown.count("nodeupgradejob/u") >= 2  # drawn twice, the second over the first
    assert shown.rindex("Completed") > shown.rindex("InProgress")


@given(current=st.one_of(st.none(), st.text(max_size=4), st.integers(0, 50).map(str)), handled=st.text(max_size=4))
def test_a_retry_value_is_new_and_counts_up_from_a_number(current: str | None, handled: str) -> None:
    """The value asked for is never the one there nor the one handled, and follows a number there."""
    value = retry_value(current, handled)
    assert value not in (current, handled)
    assert value.isdecimal()
    if current is not None and current.isdecimal() and str(int(current) + 1) != handled:
        assert value == str(int(current) + 1)


def test_a_first_retry_asks_for_one_unless_one_was_handled() -> None:
    """No annotation yet asks for 1; a job whose 1 was handled and then removed asks for 2."""
    assert retry_value(None, "") == "1"
    assert retry_value(None, "1") == "2"
    assert retry_value("7", "7") == "8"


def test_a_table_without_headers_keeps_the_columns_the_headers_set() -> None:
    """`--no-headers` drops the header line, not its width: rows line up as they would under it."""
    rows = [["a", "1"], ["bb", "2"]]
    assert table(("LONGER", "N"), rows, show_headers=False) == "a        1\nbb       2\n"
    assert table(("LONGER", "N"), rows).splitlines()[1:] == ["a        1", "bb       2"]


def test_job_names_are_written_as_kubectl_writes_them() -> None:
    """`-o name` gives KIND.GROUP/NAME, a line per job."""
    jobs = [
        JobSummary(kind="nodeupgradejob", name="u", phase="", reason="", total=0, counts={}, created=""),
        JobSummary(kind="imageprepulljob", name="p", phase="", reason="", total=0, counts={}, created=""),
    ]
    assert job_names(jobs) == "nodeupgradejob.operations.kubeedge.io/u\nimageprepulljob.operations.kubeedge.io/p\n"
