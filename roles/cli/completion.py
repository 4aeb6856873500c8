"""``nodetaskd completion SHELL``: a completion script for bash, zsh or tcsh, made by shtab from the parsers.

One parser holds it all: every command's (``roles.cli.commands``) with the roles' options beside them
(``roles.cli.main``), so ``nodetaskd --ro<TAB>`` and ``nodetaskd ctl get -<TAB>`` both complete. The script
is static (no ``nodetaskd`` process runs at a TAB): made again after an upgrade, it knows the new options.
Loaded only by that command.
"""

from __future__ import annotations

import argparse

import shtab

from roles.cli.role_options import add_role_options

__all__ = ["completion_script"]


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``nodetaskd`` for ``shell`` (``bash``, ``zsh`` or ``tcsh``), from the commands'
    ``parser`` (changed: the roles' options join it)."""
    add_role_options(parser, beside_commands=True)
    script: str = shtab.complete(parser, shell=shell)
    return script
