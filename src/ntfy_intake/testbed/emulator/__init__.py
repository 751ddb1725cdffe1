"""The bundled ntfy-compatible server ("the emulator"): what a subscriber of a real ntfy server
sees, per docs/ntfy-spec (ntfy-spec.md), plus fault injection. See docs/emulator.md.

    from ntfy_intake.testbed.emulator import NtfyEmulator, EmulatorConfig

    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.2)).running() as emu:
        emu.publish("alerts", "disk full", priority=4)
"""

from __future__ import annotations

from ntfy_intake.testbed.emulator.config import EmulatorConfig
from ntfy_intake.testbed.emulator.faults import Faults
from ntfy_intake.testbed.emulator.runner import NtfyEmulator, serve_forever

__all__ = ["EmulatorConfig", "Faults", "NtfyEmulator", "serve_forever"]
