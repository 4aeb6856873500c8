"""Atomic replacement of files and links: old or new content, the intended mode, no leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roles.common.files import link_atomically, write_atomically


def test_a_new_file_is_private_and_holds_the_data(tmp_path: Path) -> None:
    """A file written without a mode is created 0o600, since it may hold a key or a configuration."""
    target = tmp_path / "config.yaml"
    write_atomically(target, b"a: 1\n")
    assert target.read_bytes() == b"a: 1\n"
    assert target.stat().st_mode & 0o7777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_replacing_a_file_keeps_its_mode_unless_one_is_named(tmp_path: Path) -> None:
    """Rewriting an operator's 0o640 file keeps 0o640; a named mode wins over the old one."""
    target = tmp_path / "config.yaml"
    target.write_bytes(b"old")
    target.chmod(0o640)
    write_atomically(target, b"new")
    assert (target.read_bytes(), target.stat().st_mode & 0o7777) == (b"new", 0o640)
    write_atomically(target, b"newer", mode=0o644)
    assert (target.read_bytes(), target.stat().st_mode & 0o7777) == (b"newer", 0o644)


def test_a_failed_rename_leaves_the_old_content_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the rename fails, the target is untouched and the temporary copy is removed."""
    target = tmp_path / "tls.key"
    target.write_bytes(b"old key")

    def refuse(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk gone"):
        write_atomically(target, b"new key", mode=0o600)
    assert target.read_bytes() == b"old key"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.key"]


def test_a_link_replaces_a_link_or_a_file_in_place(tmp_path: Path) -> None:
    """``current`` moves from one version to the next, and also replaces a stray regular file."""
    current = tmp_path / "current"
    link_atomically(current, "versions/v1")
    assert os.readlink(current) == "versions/v1"
    link_atomically(current, "versions/v2")
    assert os.readlink(current) == "versions/v2"
    current.unlink()
    current.write_text("not a link")
    link_atomically(current, "versions/v3")
    assert os.readlink(current) == "versions/v3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current"]


def test_without_replace_an_existing_file_is_kept_and_no_temporary_is_left(tmp_path: Path) -> None:
    """``replace=False`` writes a new file whole, and leaves one that exists (a file or a link) as it was."""
    target = tmp_path / "token"
    write_atomically(target, b"first\n", replace=False)
    assert target.read_bytes() == b"first\n"
    with pytest.raises(FileExistsError):
        write_atomically(target, b"second\n", replace=False)
    assert target.read_bytes() == b"first\n"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        write_atomically(link, b"second\n", replace=False)
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "token"]
