"""`flush_each_frame` (the benches' ntfy-like writer): the backlog and live frames still arrive
whole and in order, though every write waits until the socket took the previous one."""

from __future__ import annotations

from collections.abc import Callable

from ntfy_intake.testbed.emulator import NtfyEmulator

from .conftest import RawStream


def test_flush_each_frame_delivers_the_replay_then_live_frames_whole_and_in_order(
    make_emulator: Callable[..., NtfyEmulator], open_stream: Callable[..., RawStream]
) -> None:
    emu = make_emulator(flush_each_frame=True)
    backlog = [emu.publish("alerts", f"backlog {i}")["id"] for i in range(300)]
    stream = open_stream(emu, "/alerts/json?since=all")
    assert stream.event()["event"] == "open"
    replayed = [stream.event()["id"] for _ in backlog]
    live = emu.publish("alerts", "live")["id"]
    assert stream.event()["id"] == live
    assert replayed == backlog
