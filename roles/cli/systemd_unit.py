"""The edge agent's systemd unit, rendered for this installation, with every path quoted by systemd's rules.

The unit is the packaged one (``roles/systemd/nodetaskd-edge.service``, also ``containers/systemd/``)
with this installation's interpreter, configuration and data directory. No path may hold a control
character, and the words of ``ExecStart`` are quoted, so no path can add a line to the unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Final

from roles.cli.join_layout import DEFAULT_DATA_DIR, UNIT_NAME, JoinError

__all__ = ["path_problem", "render_unit", "systemd_command", "systemd_path", "unit_template"]

_SAFE_WORD: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+:,=-")
"""Characters a word of a unit's command line may hold unquoted."""


def path_problem(path: str) -> str:
    """What keeps ``path`` out of a systemd unit or a configuration line; empty if nothing.

    A control character (a newline above all) would start a new line of the unit, and a path that is
    not UTF-8 cannot be written into it at all.
    """
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in path):
        return "holds a control character (a newline would add a line to the systemd unit)"
    try:
        path.encode()
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return ""


def systemd_command(argv: Sequence[str]) -> str:
    """``argv`` as the value of a unit's ``ExecStart``, each word quoted by systemd's rules when it needs it.

    Inside double quotes systemd undoes C escapes (so ``\\`` and ``"`` are escaped) and ``%`` starts
    a specifier (``%%`` is one ``%``); in the arguments, not the program, ``$`` starts an environment
    variable (``$$`` is one ``$``).
    """
    words = []
    for index, word in enumerate(argv):
        if word and set(word) <= _SAFE_WORD:
            words.append(word)
            continue
        escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        if index:
            escaped = escaped.replace("$", "$$")
        words.append(f'"{escaped}"')
    return " ".join(words)


def systemd_path(path: Path) -> str:
    """An absolute ``path`` as a unit's ``WorkingDirectory``: systemd expands only specifiers there."""
    return str(path).replace("%", "%%")


def render_unit(template: str, *, python: str, config: Path, data_dir: Path) -> str:
    """The packaged unit with this installation's interpreter, configuration and data directory.

    ``StateDirectory`` (which makes systemd create ``/var/lib/nodetaskd``) stays only when the data
    directory is that one.

    Errors: :class:`JoinError` naming a path that holds a control character (checked again here,
    whoever the caller: a newline would add a line to the unit).
    """
    for what, path in (("the interpreter's path", python), ("the configuration's path", str(config))):
        if problem := path_problem(path) or ("" if path.startswith("/") else "is not absolute"):
            raise JoinError(f"{what} {path!r} {problem}")
    if any(c in python for c in "\"'\\"):
        raise JoinError(f"the interpreter's path {python!r} holds a quote or backslash: systemd starts no such program")
    if problem := path_problem(str(data_dir)):
        raise JoinError(f"the data directory {str(data_dir)!r} {problem}")
    lines = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            command = (python, "-m", "roles.edge.launcher", "--config", str(config))
            lines.append(f"ExecStart={systemd_command(command)}")
        elif line.startswith("WorkingDirectory="):
            lines.append(f"WorkingDirectory={systemd_path(data_dir)}")
        elif not (line.startswith("StateDirectory") and str(data_dir) != DEFAULT_DATA_DIR):
            lines.append(line)
    return "\n".join(lines) + "\n"


def unit_template() -> str:
    """The packaged unit, as shipped with this installation."""
    return (resources.files("roles") / "systemd" / UNIT_NAME).read_text()
