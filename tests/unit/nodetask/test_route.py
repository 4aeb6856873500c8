"""Routes format as the seed specifies, parse both KubeEdge forms and fail loudly on garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.messages import parse_route
from nodetask.route import MAX_ROUTE_CHARS, Route, RouteError

label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,12}[a-z0-9])?", fullmatch=True)
names = st.lists(label, min_size=1, max_size=3).map(".".join)
routes = st.builds(
    Route,
    api_version=st.builds(
        lambda g, v: f"{g}/{v}",
        names,
        st.from_regex(r"v[0-9]{1,2}((alpha|beta)[0-9])?", fullmatch=True),
    ),
    job_type=st.from_regex(r"[a-z][a-z0-9]{0,20}", fullmatch=True),
    job=names,
    node=names,
)


@given(routes)
def test_route_round_trips(route: Route) -> None:
    """parse(str(r)) == r, and the KubeEdge singular form parses to the same route."""
    assert Route.parse(str(route)) == route
    assert Route.parse(route.kubeedge()) == route
    assert hash(Route.parse(str(route))) == hash(route)


def test_route_format_matches_the_seed() -> None:
    """The route string is <apiVersion>/<type>/<job>/nodes/<node>."""
    route = Route("operations.kubeedge.io/v1alpha2", "nodeupgradejob", "job1", "edge-1")
    assert str(route) == "operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/nodes/edge-1"
    assert route.kubeedge() == "operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/node/edge-1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "has 1 '/'-separated parts"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/edge-1", "has 5"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/nodes/edge-1/x", "has 7"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/hosts/edge-1", "expected 'nodes'"),
        ("/v1alpha2/nodeupgradejob/job1/nodes/edge-1", "the apiVersion group must not be blank"),
        ("operations.kubeedge.io//nodeupgradejob/job1/nodes/edge-1", "the apiVersion version must not be blank"),
        ("operations.kubeedge.io/v1alpha2//job1/nodes/edge-1", "the job type must not be blank"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob//nodes/edge-1", "the job name must not be blank"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/nodes/", "the node name must not be blank"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/Job_1/nodes/edge-1", "job name 'Job_1' is not"),
        ("operations.kubeedge.io/latest/nodeupgradejob/job1/nodes/edge-1", "version 'latest' is not"),
    ],
)
def test_malformed_route_says_what_is_wrong(text: str, message: str) -> None:
    """A malformed route raises RouteError naming the wrong part; it never yields an empty value."""
    with pytest.raises(RouteError, match=message):
        Route.parse(text)


@given(st.text(max_size=80))
def test_parse_never_fails_other_than_route_error(text: str) -> None:
    """Arbitrary text either parses to a route that formats back, or raises RouteError."""
    try:
        route = Route.parse(text)
    except RouteError:
        return
    assert Route.parse(str(route)) == route


def test_routes_are_immutable_so_decoded_messages_can_share_them() -> None:
    """A route's parts cannot be changed after it is built."""
    route = Route.parse("operations.kubeedge.io/v1alpha2/imageprepulljob/j/nodes/n")
    with pytest.raises(AttributeError, match="immutable"):
        route.node = "other"


part = st.text(alphabet="az09.-_A", max_size=6)


version = st.one_of(part, st.sampled_from(["v1", "v1alpha2", "v2beta1", "v1gamma1", "V1", "v1alpha"]))


@given(st.tuples(part, version, part, part, st.sampled_from(["nodes", "node", "nods"]), part))
def test_parse_accepts_exactly_what_the_validating_constructor_accepts(parts: tuple[str, ...]) -> None:
    """The one-expression fast path accepts a route exactly when the per-part checks accept its parts."""
    group, version, job_type, job, keyword, node = parts
    text = "/".join(parts)
    try:
        expected: Route | None = Route(f"{group}/{version}", job_type, job, node) if keyword != "nods" else None
    except RouteError:
        expected = None
    if expected is None:
        with pytest.raises(RouteError):
            Route.parse(text)
    else:
        assert Route.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/job..1/nodes/edge-1", "job name 'job..1' is not"),
        ("operations.kubeedge.io/v1alpha2/nodeupgradejob/job1/nodes/-edge", "node name '-edge' is not"),
        ("operations..kubeedge.io/v1alpha2/nodeupgradejob/job1/nodes/edge-1", "group 'operations..kubeedge.io'"),
        (f"g/v1/t/{'j' * 254}/nodes/n", "job name 'jjjj"),
        (f"g/v1/t/j/nodes/{'n' * 254}", "longer than 253 characters"),
        (f"{'g' * 254}/v1/t/j/nodes/n", "longer than 253 characters"),
        (f"g/v1/{'t' * 64}/j/nodes/n", "job type 'tttt"),
        (f"g/v{'1' * 63}/t/j/nodes/n", "longer than 63 characters"),
    ],
)
def test_route_parts_get_kubernetes_names_and_length_limits(text: str, message: str) -> None:
    """Job and node names are DNS subdomains of at most 253 characters, versions and types at most 63."""
    with pytest.raises(RouteError, match=message):
        Route.parse(text)


def test_longest_valid_route_parses() -> None:
    """A route with every part at its limit is exactly the longest text parsing accepts."""
    text = f"{'g' * 253}/v{'1' * 62}/{'t' * 63}/{'j' * 253}/nodes/{'n' * 253}"
    assert len(text) == MAX_ROUTE_CHARS
    assert Route.parse(text).node == "n" * 253


@pytest.mark.parametrize("part", range(5))
def test_megabyte_route_parts_are_refused_without_growing_the_route_cache(part: int) -> None:
    """A route with a 1 MB part is refused, names itself in a short error and is never cached."""
    parts = ["operations.kubeedge.io", "v1alpha2", "nodeupgradejob", "job1", "edge-1"]
    parts[part] = "a" * 1_000_000 if part != 1 else "v" + "1" * 1_000_000
    before = parse_route.cache_info().currsize
    for i in range(20):
        text = "/".join([*parts[:4], "nodes", parts[4]]) + str(i)
        with pytest.raises(RouteError) as refused:
            parse_route(text)
        assert len(str(refused.value)) < 512
    assert parse_route.cache_info().currsize == before
