"""Hypothesis strategies shared by the diagnosis graph and path-flow tests."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def dags(draw: st.DrawFn) -> list[list[int]]:
    """A random DAG with the start node 0 first: edges go forward in a shuffled order of the others."""
    n = draw(st.integers(min_value=1, max_value=9))
    order = [0, *draw(st.permutations(range(1, n)))]
    successors: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.booleans()):
                successors[order[i]].append(order[j])
    for targets in successors:
        targets[:] = draw(st.permutations(targets))
    return successors
