"""The exception tree. Expected failures (a webhook 500, a bad frame) are values, not exceptions.

IntakeError
├── ConfigError        a bad setting; the CLI prints one line naming the key and exits 2
├── StartupError       a permanent cause at start-up (corrupt database, unusable state dir):
│   │                  the CLI prints one line and exits 2, so systemd stops restarting
│   └── SchemaTooNew   the database holds a migration this version does not know (a newer
│                      version wrote it)
├── StoreError         SQLite refused a statement (wrapped, original in __cause__)
│   └── InjectedFault  a test-only fault raised between the last statement and COMMIT
├── Fenced             a write of a leadership term that is over (another node took the lease)
├── AuditWriteError    the JSONL audit log could not be appended or fsynced (trips the latch)
└── FeedError          an agent-feed request that cannot be honoured (ack beyond head, ...)
"""

from __future__ import annotations


class IntakeError(Exception):
    """ntfy-intake failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(IntakeError):
    """A configuration value is invalid."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"config error: {key}: {problem}")


class StartupError(IntakeError):
    """Start-up cannot succeed until someone fixes the cause; restarting cannot help."""


class SchemaTooNew(StartupError):
    """The database was migrated by a newer ntfy-intake; this version cannot run on it."""


class DatabaseUnreachable(IntakeError):
    """The PostgreSQL server does not answer at start-up: waited out, never an exit."""


class StoreError(IntakeError):
    """The SQLite store refused an operation."""


class InjectedFault(StoreError):
    """A fault injected by a test between the last statement and COMMIT."""


class Fenced(IntakeError):
    """This node's leadership term is over: the write was rolled back; step down."""


class StateLockedError(IntakeError):
    """Another daemon holds the state directory."""


class AuditWriteError(IntakeError):
    """The audit log could not be written durably."""


class FeedError(IntakeError):
    """The agent feed refused a request."""
