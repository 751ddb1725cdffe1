"""EmulatorConfig: every knob of the bundled ntfy-compatible server, validated once.

Defaults are ntfy's defaults (keepalive 45 s, cache 12 h, manager every 60 s, delayed sender every
10 s, 4096-byte messages, the request limiter on and 30 subscriptions per visitor), so code that
publishes or reconnects in bulk must turn the limits off explicitly. The emulator-only admin
surface under /v1/emulator/ is on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

TOKEN_PATTERN = re.compile(r"tk_[a-z0-9]{29}", re.ASCII)
NTFY_VERSIONS = frozenset({"2.13", "2.17"})


@dataclass(frozen=True)
class EmulatorConfig:
    """Settings for one emulator instance.

    tokens: None turns auth off (ntfy without `auth-file`: Authorization is ignored). A mapping
        turns it on: each token (`tk_` + 29 lowercase alphanumerics) maps to the topics it may
        read (`*` is a wildcard, as in ntfy ACLs). Anonymous clients read nothing. Everyone may
        publish.
    clock: seconds since the epoch; message times, `expires`, duration-form `since`, pruning and
        the rate-limit buckets all read it.
    request_limit: the per-visitor request bucket (burst 60, one token back every 5 s), on by
        default as in ntfy.
    subscription_limit: concurrent subscriptions per visitor (30, ntfy's default); None is off.
    delayed_sender_interval: seconds between runs of ntfy's delayed sender, which publishes
        scheduled messages that have fallen due (by the injected clock); None disables the
        background runs (call `NtfyEmulator.send_delayed()` instead).
    ntfy_version: the server generation to model: "2.17" (sequence_id, message_delete and
        message_clear) or "2.13" (none of those).
    auth_failure_limit: ntfy's (not configurable) 30 failed logins, one back per minute.
    manager_interval: seconds between background prune runs; None disables them.
    admin: serve the fault-injection and inspection endpoints under /v1/emulator/.
    flush_each_frame: write like ntfy does (one chunk per frame, flushed, and the next frame only
        once the socket took it, as Go's blocking write does), never several frames buffered in
        the server and sent together. Off by default: the benches turn it on.
    """

    keepalive_interval: float = 45.0
    cache_duration: float = 43200.0
    tokens: Mapping[str, Collection[str]] | None = None
    clock: Callable[[], float] = time.time
    request_limit: bool = True
    request_limit_burst: int = 60
    request_limit_replenish: float = 5.0
    subscription_limit: int | None = 30
    auth_failure_limit: bool = True
    manager_interval: float | None = 60.0
    message_size_limit: int = 4096
    delayed_sender_interval: float | None = 10.0
    ntfy_version: str = "2.17"
    admin: bool = True
    flush_each_frame: bool = False

    @property
    def sequences(self) -> bool:
        """ntfy 2.16+: sequence_id, message_delete and message_clear exist."""
        return self.ntfy_version != "2.13"

    def __post_init__(self) -> None:
        if self.keepalive_interval <= 0:
            raise ValueError("keepalive_interval must be positive")
        if self.cache_duration < 0:
            raise ValueError("cache_duration must not be negative")
        if self.manager_interval is not None and self.manager_interval <= 0:
            raise ValueError("manager_interval must be positive or None")
        if self.subscription_limit is not None and self.subscription_limit < 0:
            raise ValueError("subscription_limit must not be negative")
        if self.request_limit_burst < 1 or self.request_limit_replenish <= 0:
            raise ValueError("request limit burst and replenish must be positive")
        if self.delayed_sender_interval is not None and self.delayed_sender_interval <= 0:
            raise ValueError("delayed_sender_interval must be positive or None")
        if self.ntfy_version not in NTFY_VERSIONS:
            raise ValueError(f"ntfy_version must be one of {sorted(NTFY_VERSIONS)}")
        if self.message_size_limit < 1:
            raise ValueError("message_size_limit must be positive")
        for token in self.tokens or {}:
            if TOKEN_PATTERN.fullmatch(token) is None:
                raise ValueError("a token must be 'tk_' followed by 29 lowercase alphanumerics")
