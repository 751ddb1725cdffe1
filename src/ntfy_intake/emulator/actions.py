"""Action buttons: ntfy's `X-Actions` header (simple or JSON form) and JSON `actions`.

Pure. Invariants owned here (ntfy `server/actions.go`, checked against a real v2.13 server):
- the simple form is `action, label, url, key=value, ...; next action` with quoting by `"` or `'`
  (backslash escapes the quote); the first three unnamed terms are action, label and (for view
  and http) url; `headers.X=` and `extras.X=` fill maps; any other term is an error;
- a value starting with `[` is a JSON array of action objects (keys matched case-insensitively);
- every action gets a fresh 10-character id; `action` is lowercased and `method` uppercased;
- at most 3 actions; `action` is view, broadcast or http; `label` is required; view and http need
  a url; an http action with method GET or HEAD cannot have a body;
- an action serialises as `id, action, label, clear` (always) then `url, method, headers, body,
  intent, extras` when set, maps with sorted keys (Go's encoder).
Errors are 400 40018 "invalid request: actions invalid; <reason>".
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from ntfy_intake.emulator.params import go_trim
from ntfy_intake.emulator.wire import ID_ALPHABET, NtfyError

ACTION_ID_LENGTH = 10
ACTIONS_MAX = 3
_KINDS = ("view", "broadcast", "http")
_WITH_URL = ("view", "http")
_KEY = re.compile(r"([-.\w]+)\s*=\s*", re.ASCII)
_SPACES = " \t\r\n"
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_STRING_FIELDS = ("id", "action", "label", "url", "method", "body", "intent")
ACTIONS_INVALID = NtfyError(
    40018, 400, "invalid request: actions invalid", "https://ntfy.sh/docs/publish/#action-buttons"
)


class ActionError(ValueError):
    """Why an actions value was refused (ntfy's wording)."""


@dataclass
class Action:
    action: str = ""
    label: str = ""
    clear: bool = False
    url: str = ""
    method: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    intent: str = ""
    extras: dict[str, str] = field(default_factory=dict)
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "action": self.action,
            "label": self.label,
            "clear": self.clear,
        }
        optional: list[tuple[str, Any]] = [
            ("url", self.url),
            ("method", self.method),
            ("headers", dict(sorted(self.headers.items()))),
            ("body", self.body),
            ("intent", self.intent),
            ("extras", dict(sorted(self.extras.items()))),
        ]
        out.update((key, value) for key, value in optional if value)
        return out


def parse_actions_param(value: str) -> tuple[dict[str, Any], ...]:
    """The `actions` of an event, in wire form, or NtfyError 40018."""
    try:
        return tuple(action.to_dict() for action in parse_actions(value))
    except ActionError as error:
        raise ACTIONS_INVALID.wrap(str(error)) from None


def parse_actions(value: str) -> list[Action]:
    text = go_trim(value)
    actions = _from_json(text) if text.startswith("[") else _SimpleParser(text).parse()
    for action in actions:
        action.id = "".join(secrets.choice(ID_ALPHABET) for _ in range(ACTION_ID_LENGTH))
        action.action = action.action.lower()
        action.method = action.method.upper()
    if len(actions) > ACTIONS_MAX:
        raise ActionError(f"only {ACTIONS_MAX} actions allowed")
    for action in actions:
        if action.action not in _KINDS:
            raise ActionError(
                f"parameter 'action' cannot be '{action.action}', valid values are 'view', "
                "'broadcast' and 'http'"
            )
        if action.label == "":
            raise ActionError("parameter 'label' is required")
        if action.action in _WITH_URL and action.url == "":
            raise ActionError(f"parameter 'url' is required for action '{action.action}'")
        if action.action == "http" and action.method in ("GET", "HEAD") and action.body:
            raise ActionError(f"parameter 'body' cannot be set if method is {action.method}")
    return actions


def actions_from_json_values(items: list[Any]) -> list[dict[str, Any]]:
    """JSON publishing: decode `actions` as Go decodes []action (TypeError on a wrong type),
    then re-encode them for the X-Actions header, as ntfy's transformBodyJSON does."""
    return [_decode_action(item).to_dict() for item in items]


def _from_json(text: str) -> list[Action]:
    try:
        items = json.loads(text)
    except ValueError as error:
        raise ActionError(f"JSON error: {error}") from None
    if not isinstance(items, list):
        raise ActionError("JSON error: cannot unmarshal into a list of actions")
    try:
        return [_decode_action(item) for item in items]
    except TypeError as error:
        raise ActionError(f"JSON error: {error}") from None


def _decode_action(item: Any) -> Action:
    """Go's json.Unmarshal into the action struct: keys case-insensitive, null skipped."""
    action = Action()
    if item is None:
        return action
    if not isinstance(item, dict):
        raise TypeError("cannot unmarshal a non-object into an action")
    for key, value in item.items():
        name = key.lower()
        if value is None:
            continue
        if name in _STRING_FIELDS:
            if not isinstance(value, str):
                raise TypeError(f"action field {key!r} must be a string")
            setattr(action, name, value)
        elif name == "clear":
            if not isinstance(value, bool):
                raise TypeError("action field 'clear' must be a boolean")
            action.clear = value
        elif name in ("headers", "extras"):
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise TypeError(f"action field {key!r} must map strings to strings")
            setattr(action, name, dict(value))
    return action


class _SimpleParser:
    """parseActionsFromSimple: a hand-written lexer over the input, as ntfy's."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self) -> list[Action]:
        actions = []
        while self.pos < len(self.text):
            actions.append(self._action())
        return actions

    def _action(self) -> Action:
        action = Action()
        section = 0
        while True:
            key, value, last = self._section()
            _populate(action, section, key, value)
            self._skip_spaces()
            if last:
                return action
            section += 1

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _skip_spaces(self) -> None:
        while self._peek() and self._peek() in _SPACES:
            self.pos += 1

    def _section(self) -> tuple[str, str, bool]:
        self._skip_spaces()
        key = ""
        match = _KEY.match(self.text, self.pos)
        if match is not None:
            key = match.group(1)
            self.pos = match.end()
        char = self._peek()
        if char in ("", ";", ","):
            self.pos += len(char)
            return key, "", char in ("", ";")
        if char in ('"', "'"):
            value, last = self._quoted(char)
            return key, value, last
        start = self.pos
        while self._peek() not in ("", ";", ","):
            self.pos += 1
        end = self._peek()
        value = go_trim(self.text[start : self.pos])
        self.pos += len(end)
        return key, value, end in ("", ";")

    def _quoted(self, quote: str) -> tuple[str, bool]:
        self.pos += 1
        start = self.pos
        previous = ""
        while True:
            char = self._peek()
            if char == "":
                raise ActionError(f"unexpected end of input, quote started at position {start}")
            if char == quote and previous != "\\":
                value = self.text[start : self.pos].replace("\\" + quote, quote)
                self.pos += 1
                self._skip_spaces()
                end = self._peek()
                if end not in ("", ";", ","):
                    raise ActionError(f"unexpected character '{end}' at position {self.pos}")
                self.pos += len(end)
                return value, end in ("", ";")
            previous = char
            self.pos += 1


def _populate(action: Action, section: int, key: str, value: str) -> None:
    if key == "" and section == 0:
        key = "action"
    elif key == "" and section == 1:
        key = "label"
    elif key == "" and section == 2 and action.action in _WITH_URL:
        key = "url"
    if key == "":
        raise ActionError(f"term '{value}' unknown")
    if key.startswith("headers."):
        action.headers[key.removeprefix("headers.")] = value
    elif key.startswith("extras."):
        action.extras[key.removeprefix("extras.")] = value
    elif key.lower() == "clear":
        if value.lower() not in _BOOLEANS:
            raise ActionError(
                f"parameter 'clear' cannot be '{value}', only boolean values are allowed "
                "(true/yes/1/false/no/0)"
            )
        action.clear = _BOOLEANS[value.lower()]
    elif key.lower() in ("action", "label", "url", "method", "body", "intent"):
        setattr(action, key.lower(), value)
    else:
        raise ActionError(f"key '{key}' unknown")
