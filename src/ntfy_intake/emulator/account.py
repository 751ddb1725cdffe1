"""`GET /v1/account` for an anonymous visitor, shaped as a real ntfy v2.13 server answers it
(limits derived from the configuration as ntfy's `configBasedVisitorLimits` does, with ntfy's
default e-mail, attachment and reservation limits; the emulator has no e-mail, calls,
reservations or attachments, so their usage is always 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ntfy_intake.emulator.hub import Hub

_DAY_S = 86400
_EMAIL_REPLENISH_S = 3600  # visitor-email-limit-replenish: 1 h, so 24 a day
_ATTACHMENT_TOTAL = 100 * 1024 * 1024
_ATTACHMENT_FILE = 15 * 1024 * 1024
_ATTACHMENT_EXPIRY_S = 3 * 3600
_ATTACHMENT_BANDWIDTH = 500 * 1024 * 1024


def anonymous_account(hub: Hub, visitor: str) -> dict[str, Any]:
    config = hub.config
    messages_limit = int(_DAY_S // config.request_limit_replenish)
    emails_limit = _DAY_S // _EMAIL_REPLENISH_S
    sent = hub.visitor_messages(visitor)
    return {
        "username": "*",
        "role": "anonymous",
        "limits": {
            "basis": "ip",
            "messages": messages_limit,
            "messages_expiry_duration": int(config.cache_duration),
            "emails": emails_limit,
            "calls": 0,
            "reservations": 0,
            "attachment_total_size": _ATTACHMENT_TOTAL,
            "attachment_file_size": _ATTACHMENT_FILE,
            "attachment_expiry_duration": _ATTACHMENT_EXPIRY_S,
            "attachment_bandwidth": _ATTACHMENT_BANDWIDTH,
        },
        "stats": {
            "messages": sent,
            "messages_remaining": max(0, messages_limit - sent),
            "emails": 0,
            "emails_remaining": emails_limit,
            "calls": 0,
            "calls_remaining": 0,
            "reservations": 0,
            "reservations_remaining": 0,
            "attachment_total_size": 0,
            "attachment_total_size_remaining": _ATTACHMENT_TOTAL,
        },
    }
