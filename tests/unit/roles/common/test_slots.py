"""Connection places per peer: no address holds more than its share, nobody more than the total."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.common.slots import PeerSlots

PEERS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")


@given(st.lists(st.tuples(st.sampled_from(["take", "give"]), st.sampled_from(PEERS)), max_size=80))
def test_no_peer_holds_more_than_its_share_and_all_places_come_back(steps: list[tuple[str, str]]) -> None:
    """Whatever peers do, each holds at most per_peer places, all of them at most total, and every place returns."""
    places = PeerSlots(total=5, per_peer=2)
    held: Counter[str] = Counter()
    for step, peer in steps:
        if step == "take":
            refusal = places.take(peer)
            if refusal is None:
                held[peer] += 1
            else:
                # Refused only when a cap is really reached, and it names that cap.
                assert (refusal == "per_peer") == (held[peer] >= 2)
                assert refusal == "per_peer" or places.all.used == 5
        elif held[peer]:
            places.give(peer)
            held[peer] -= 1
        assert all(places.held(p) == held[p] <= 2 for p in PEERS)
        assert places.all.used == sum(held.values()) <= 5
    for peer, count in held.items():
        for _ in range(count):
            places.give(peer)
    assert places.all.used == 0
    assert all(places.held(p) == 0 for p in PEERS)


def test_a_peer_at_its_share_leaves_room_for_others() -> None:
    """One address filling its share is refused, while another address still gets a place."""
    places = PeerSlots(total=3, per_peer=2)
    assert places.take("a") is None
    assert places.take("a") is None
    assert places.take("a") == "per_peer"
    assert places.take("b") is None
    assert places.take("c") == "total"
    places.give("a")
    assert places.take("c") is None


def test_giving_back_a_place_a_peer_never_took_is_a_bug() -> None:
    """A place given back for the wrong peer is caught rather than freeing someone else's."""
    places = PeerSlots(total=2, per_peer=1)
    assert places.take("a") is None
    with pytest.raises(AssertionError):
        places.give("b")
