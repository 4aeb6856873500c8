"""The demo's supervisor keeps track of every child it starts, even when Ctrl-C lands while starting one."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tools.demo import procs
from tools.demo.procs import Supervisor


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@pytest.fixture
def interruptible() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as the demo's handler makes it."""
    before = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_while_a_child_starts_is_raised_once_the_child_is_recorded(
    interruptible: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupt that lands right after the fork still stops the demo, and the child is stopped with the rest."""
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real_popen(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        return child

    monkeypatch.setattr(subprocess, "Popen", popen_then_ctrl_c)
    supervisor = Supervisor(marker=str(tmp_path))
    argv = [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        supervisor.start("sleeper", argv, log=tmp_path / "sleeper.log")
    (child,) = supervisor.children
    assert child.alive()
    supervisor.stop(grace=2)
    assert not child.alive()
    assert signal.getsignal(signal.SIGINT) is _interrupt


def test_nothing_is_held_back_when_no_signal_comes(interruptible: None) -> None:
    """A block without a signal leaves the handlers as they were and raises nothing."""
    with procs._interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is _interrupt
