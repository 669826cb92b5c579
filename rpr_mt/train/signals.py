"""Ctrl-C, SIGTERM and SIGHUP during training: the first asks for a checkpoint and a stop, a second stops at once.
Elsewhere (``translate -o FILE``), SIGTERM and SIGHUP unwind as Ctrl-C does, so that what was finished is kept.

SIGHUP is what a closed terminal or ssh session sends a run started without nohup; its default would end the run
between checkpoints. A signal that the process ignores (nohup ignores SIGHUP) stays ignored."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


# SIGHUP does not exist on Windows
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StopSignal:
    """First SIGINT/SIGTERM/SIGHUP asks the loop to save and stop at the next update; a second one stops at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():  # signal handlers need the main thread
            for sig in STOP_SIGNALS:
                if sig != signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose: `nohup rpr-mt train ...` must go on after a logout
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = signal.Signals(signum).name
        for sig, handler in self.previous.items():  # a second signal gets the default behaviour
            signal.signal(sig, handler)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP raised as an interrupt by ``interrupt_on_stop_signals``; ``signum``: which one. Its text is
    the signal's name and ``detail`` (what the CLI prints after "stopped by")."""

    def __init__(self, signum: int, detail: str = "") -> None:
        super().__init__(signal.Signals(signum).name + (f" {detail}" if detail else ""))
        self.signum = signum


@contextlib.contextmanager
def interrupt_on_stop_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``Terminated`` (a KeyboardInterrupt) inside the block, as SIGINT raises
    KeyboardInterrupt: their defaults end the process at once, with no ``finally`` run, so `timeout`, a batch
    scheduler's time limit or a closed terminal would lose the finished lines that Ctrl-C keeps."""
    def handle(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers need the main thread
        for sig in STOP_SIGNALS:
            if sig != signal.SIGINT and signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                previous[sig] = signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interruption(exc: KeyboardInterrupt) -> str:
    """What stopped the work, for its one line: "interrupted" (Ctrl-C), or "stopped by " and the ``Terminated``'s
    text ("SIGTERM", with its detail where it has one)."""
    return f"stopped by {exc}" if isinstance(exc, Terminated) else "interrupted"


def exit_status(exc: KeyboardInterrupt) -> int:
    """The shell's status for the signal that stopped the work: 128 + its number (130 for Ctrl-C, 143 SIGTERM)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def signal_exit_status(name: str | None) -> int:
    """``exit_status`` for a signal known by its name (``TrainResult.signal``: "SIGTERM"); None counts as Ctrl-C (a
    DDP rank stopped because another rank received the signal)."""
    return 128 + (signal.Signals[name].value if name else signal.SIGINT.value)


@contextlib.contextmanager
def before_first_update() -> Iterator[None]:
    """Training's start-up (the run directory, the data, the model), until ``StopSignal`` takes over at the loop:
    SIGINT, SIGTERM and SIGHUP stop it as ``Terminated`` saying that there is nothing to save (SIGTERM's default
    would end the process silently with 143, where a stop is promised a line). No update has been made, so no
    checkpoint is written (a resumed run's checkpoints stay as they are)."""
    try:
        with interrupt_on_stop_signals():
            yield
    except KeyboardInterrupt as exc:  # Ctrl-C, or this block's (or data preparation's) Terminated
        signum = getattr(exc, "signum", signal.SIGINT)
        raise Terminated(signum, "before the first update; nothing to save") from None
