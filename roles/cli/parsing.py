"""What every ``nodetaskd`` command line shares: the exit statuses, the argument parser, the error line.

A role (:mod:`roles.cli.main`) and a command (:mod:`roles.cli.commands`) end the same ways: one line on
stderr naming what is wrong, and a status a script can tell apart.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Final, NoReturn

__all__ = [
    "DIRECTORIES",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "FILES",
    "Parser",
    "completes",
    "fail",
    "leaf",
]

EXIT_FAILED: Final = 1
"""A command's work failed (a write on the device, a watched job that failed)."""
EXIT_USAGE: Final = 2
"""Bad arguments or configuration, or an input that does not fit."""
EXIT_UNAVAILABLE: Final = 3
"""The API server could not be reached or refused, or an extra is missing."""
EXIT_INTERRUPTED: Final = 130
"""Interrupted (Ctrl-C)."""


FILES: Final = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}
"""What a shell completes a path option's value with (shtab's ``FILE``, spelled here: shtab loads only when a
completion script is made)."""
DIRECTORIES: Final = {"bash": "_shtab_compgen_dirs", "zsh": "_files -/", "tcsh": "d"}


def completes(action: argparse.Action, what: Mapping[str, str]) -> argparse.Action:
    """``action`` with the shell completion of its value (:data:`FILES`, :data:`DIRECTORIES`) set for shtab."""
    action.complete = what  # type: ignore[attr-defined]
    return action


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors end with :data:`EXIT_USAGE` and one line naming the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def fail(message: str, status: int) -> int:
    """Write ``message`` as ``nodetaskd``'s one error line; return ``status`` for the caller to exit with."""
    sys.stderr.write(f"nodetaskd: error: {message}\n")
    return status


def leaf(error: BaseException) -> BaseException:
    """The first exception inside nested task-group exception groups (``error`` itself if it is none)."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
