"""rpr_mt/train/signals.py: which signals stop a run with a checkpoint, and which stay as the user set them."""

from __future__ import annotations

import signal

import pytest

from rpr_mt.train.signals import StopSignal, Terminated, before_first_update


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_a_hang_up_asks_for_a_stop_unless_nohup_ignores_it():
    previous = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with StopSignal() as stop:
            signal.raise_signal(signal.SIGHUP)
            assert stop.requested == "SIGHUP"
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what `nohup rpr-mt train ...` sets up
        with StopSignal() as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
            assert stop.requested is None
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_the_first_update_stops_with_nothing_to_save(signum, request):
    """SIGTERM's default ended the start-up without a word (exit 143); Ctrl-C said only 'interrupted'."""
    # The test asks what the signal does to a run in a terminal's foreground, whatever pytest was started with:
    # `nohup ... &` (and some CI runners) start it with SIGINT ignored, which training keeps ignored until its loop
    as_in_a_terminal = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    before = signal.signal(signum, as_in_a_terminal)
    request.addfinalizer(lambda: signal.signal(signum, before))
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as info:
        with before_first_update():
            signal.raise_signal(signum)
    assert info.value.signum == signum
    assert str(info.value) == f"{signal.Signals(signum).name} before the first update; nothing to save"
    assert signal.getsignal(signal.SIGTERM) is previous  # the loop's StopSignal takes over from the default
