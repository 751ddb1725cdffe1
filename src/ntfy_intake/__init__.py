"""ntfy-intake: exactly one recorded outcome per ntfy event, across any crash."""

__version__ = "0.1.0"
