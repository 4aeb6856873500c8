"""Where ``nodetaskd edge join`` puts each file, and the record of what it created that ``edge reset`` reads.

The ground join (:mod:`roles.cli.join`) and reset (:mod:`roles.cli.reset`) share: the paths under a
root, the record (``etc/nodetaskd/join.json``), and the errors both raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from roles.edge.config_update.pending import pending_path

__all__ = ["DEFAULT_DATA_DIR", "UNIT_NAME", "JoinError", "JoinRecord", "Layout", "ResetError", "load_record"]

UNIT_NAME: Final = "nodetaskd-edge.service"
DEFAULT_DATA_DIR: Final = "/var/lib/nodetaskd"


class JoinError(ValueError):
    """The join or reset cannot go ahead; the message names what is wrong and what would allow it."""


class ResetError(JoinError):
    """Reset removed what it could and failed on the rest (named); the record stays, so running it again retries."""

    def __init__(self, message: str, done: list[str]) -> None:
        super().__init__(message)
        self.done = done


@dataclass(frozen=True, slots=True)
class Layout:
    """Where join puts each file under ``root``."""

    root: Path

    @property
    def config_dir(self) -> Path:
        return self.root / "etc" / "nodetaskd"

    @property
    def config(self) -> Path:
        return self.config_dir / "edge.yaml"

    @property
    def token(self) -> Path:
        return self.config_dir / "token"

    @property
    def ca(self) -> Path:
        return self.config_dir / "ca.crt"

    @property
    def record(self) -> Path:
        return self.config_dir / "join.json"

    @property
    def data_dir(self) -> Path:
        return self.root / DEFAULT_DATA_DIR.lstrip("/")

    @property
    def unit(self) -> Path:
        return self.root / "etc" / "systemd" / "system" / UNIT_NAME

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file join writes, and the one the agent leaves beside its configuration during an update."""
        return (self.config, self.token, self.ca, self.unit, pending_path(self.config))

    @property
    def parents(self) -> tuple[Path, ...]:
        """The directories above the config and data directories and the unit, up to (not including) the root."""
        found: list[Path] = []
        for top in (self.config_dir, self.data_dir, self.unit.parent):
            for directory in (top, *top.parents):
                if self.root in directory.parents and directory not in (self.config_dir, self.data_dir, *found):
                    found.append(directory)
        return tuple(found)


class JoinRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a join created: reset removes these (those of them that are paths join writes) and nothing else."""

    node: str
    files: tuple[str, ...]
    directories: tuple[str, ...] = ()
    """Created by the join, removed by reset (the data directory whole: it holds the agent's store)."""
    parents: tuple[str, ...] = ()
    """Directories above those that the join created; reset removes them when they are empty."""


def load_record(layout: Layout) -> JoinRecord | None:
    """The record of the join under ``layout``; None if there is none. Errors: :class:`JoinError` if unreadable."""
    try:
        return msgspec.json.decode(layout.record.read_bytes(), type=JoinRecord)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        raise JoinError(f"cannot read {layout.record}: {exc}; remove what join wrote by hand") from None
