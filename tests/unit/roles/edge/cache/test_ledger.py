"""The error-key ledger: its two-slot file, its survival of restarts and torn writes, and its persisted flag."""

from __future__ import annotations

import os
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodetask.messages import CacheKey
from roles.edge.cache.ledger import (
    FILE_BYTES,
    LEDGER_FILE,
    SLOT_BYTES,
    ErrorEntry,
    Ledger,
    LedgerState,
    LedgerTooLarge,
    decode_file,
    encode_slot,
    key_text,
)

LOG = structlog.get_logger()


def key(name: str, kind: str = "Pod", ns: str = "ns") -> CacheKey:
    return CacheKey(kind=kind, namespace=ns, name=name)


keys = st.builds(key, st.sampled_from(["a", "b", "c"]), st.sampled_from(["Pod", "ConfigMap"]))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys, st.text(max_size=20)),
        st.tuples(st.just("clear"), keys, st.none()),
        st.tuples(st.just("request"), st.booleans(), st.none()),
        st.tuples(st.just("restart"), st.none(), st.none()),
        # A write torn by a power cut: a prefix of the next slot reaches the disk, then the agent restarts.
        st.tuples(st.just("torn"), keys, st.integers(0, 200)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_puts_clears_and_restarts_keep_the_ledger_equal_to_a_dict(program: list[tuple[str, Any, Any]]) -> None:
    """Puts, clears and request changes, with restarts and torn writes between them, always reopen to
    what a plain dict says: every completed change, and nothing of a torn one."""
    model: dict[CacheKey, str] = {}
    requested = False

    async def main(home: Path) -> None:
        nonlocal requested
        ledger = await Ledger.open(home, log=LOG)
        for op, arg, extra in program:
            if op == "put":
                await ledger.update(failed={arg: extra})
                model[arg] = extra
            elif op == "clear":
                await ledger.update(cleared=[arg])
                model.pop(arg, None)
            elif op == "request":
                await ledger.update(requested=arg)
                requested = arg
            else:
                if op == "torn":
                    path = home / LEDGER_FILE
                    data = path.read_bytes()
                    found = decode_file(data)
                    assert found is not None
                    seq = found[0] + 1
                    # A state no other write holds, so that no stale byte left in the slot completes it.
                    torn = ErrorEntry(key=CacheKey(kind="Torn", name="never"), reason="half-written")
                    slot = encode_slot(seq, LedgerState(requested=not requested, errors=(torn,)))
                    at = (seq % 2) * SLOT_BYTES
                    magic, _, payload_length, _ = struct.unpack_from("<8sQII", slot)
                    assert magic == b"NTLEDGR1"
                    cut = extra % (24 + payload_length)  # anywhere before its last byte
                    path.write_bytes(data[:at] + slot[:cut] + data[at + cut :])
                ledger = await Ledger.open(home, log=LOG)
            assert dict(ledger.errors) == model
            assert ledger.requested == requested
            assert ledger.persisted

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


async def test_the_file_is_allocated_whole_and_private_when_opened(tmp_path: Path) -> None:
    """Opening a ledger allocates its file in full (0600), so that later writes need no new space."""
    ledger = await Ledger.open(tmp_path, log=LOG)
    path = tmp_path / LEDGER_FILE
    assert ledger.persisted
    assert path.stat().st_size == FILE_BYTES
    assert path.stat().st_blocks * 512 >= FILE_BYTES, "written, not a sparse hole"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_a_ledger_it_cannot_write_works_in_memory_and_says_so(tmp_path: Path) -> None:
    """While the file cannot be written the ledger keeps its keys in memory with ``persisted`` false
    (logged); the first write that works persists everything and sets it again."""
    home = tmp_path / "data"
    home.write_bytes(b"")  # a file where its directory should be: nothing can be created in it
    with structlog.testing.capture_logs() as logs:
        ledger = await Ledger.open(home, log=LOG)
        await ledger.update(failed={key("a"): "disk full"})
    assert not ledger.persisted
    assert ledger.errors == {key("a"): "disk full"}
    assert "ledger_not_persisted" in [entry["event"] for entry in logs]
    home.unlink()
    home.mkdir()
    await ledger.update(failed={key("b"): "io error"})
    same = ledger  # (a fresh name: mypy would keep the narrowing of ``ledger.persisted`` across the write)
    assert same.persisted
    reopened = await Ledger.open(home, log=LOG)
    assert reopened.errors == {key("a"): "disk full", key("b"): "io error"}


async def test_a_ledger_replaced_by_a_directory_is_not_persisted_but_keeps_working(tmp_path: Path) -> None:
    """A file that cannot be opened (here: a directory in its place) leaves the ledger in memory, flagged."""
    (tmp_path / LEDGER_FILE).mkdir()
    with structlog.testing.capture_logs() as logs:
        ledger = await Ledger.open(tmp_path, log=LOG)
    assert not ledger.persisted
    assert "ledger_unreadable" in [entry["event"] for entry in logs]
    await ledger.update(failed={key("a"): "disk full"}, requested=True)
    assert ledger.errors == {key("a"): "disk full"}
    assert ledger.requested


async def test_a_ledger_too_large_for_a_slot_stays_in_memory(tmp_path: Path) -> None:
    """Thousands of distinct errored keys with distinct reasons outgrow a slot: kept in memory, not persisted."""
    ledger = await Ledger.open(tmp_path, log=LOG)
    many = {key(f"pod-{i:05d}"): os.urandom(32).hex() for i in range(3000)}  # incompressible reasons
    await ledger.update(failed=many)
    assert not ledger.persisted
    assert len(ledger.errors) == 3000
    entries = tuple(ErrorEntry(key=k, reason=r) for k, r in many.items())
    with pytest.raises(LedgerTooLarge, match="3000 errored keys"):
        encode_slot(1, LedgerState(errors=entries))


def test_a_file_of_zeros_or_garbage_is_an_empty_ledger() -> None:
    """Neither slot intact means no ledger yet (a fresh file), not an error."""
    assert decode_file(bytes(FILE_BYTES)) is None
    assert decode_file(b"garbage" * 100) is None
    assert decode_file(b"") is None


def test_keys_read_as_kind_namespace_and_name() -> None:
    """The condition's message names keys as ``Kind/namespace/name``, or ``Kind/name`` when cluster-scoped."""
    assert key_text(key("web-1")) == "Pod/ns/web-1"
    assert key_text(CacheKey(kind="Node", name="edge-1")) == "Node/edge-1"
