"""Publishing: turn a PUT/POST/GET publish request into an event, as ntfy's handlePublish does.

Pure: time comes in as an argument. Invariants owned here (ntfy-spec.md section 6):
- parameters are checked in ntfy's order, so the same bad request gets the same error code;
- a body under `message-size-limit` (4096) bytes that is valid UTF-8 becomes the trimmed message and
  overrides a `message` parameter; an empty result is "triggered"; a larger or non-UTF-8 body would
  be an attachment, which is not configured: 400 code 40014, never 413;
- `Cache` is true unless given and not 1/yes/true; a cached event gets `expires = time + duration`;
- `?template=alertmanager|grafana` renders the JSON body into the title and message as ntfy >= 2.14
  does (templates.py), in ntfy's place: after the attachment cases, before the plain body;
- JSON publishing (`/`) is limited to 2x the message limit (413, 41303), needs a valid `topic`
  (40009), and is rewritten into the same headers ntfy sets before the normal path runs.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ntfy_intake.testbed.emulator import schedule, templates, wire
from ntfy_intake.testbed.emulator.actions import actions_from_json_values, parse_actions_param
from ntfy_intake.testbed.emulator.params import Params, go_trim, parse_priority
from ntfy_intake.testbed.emulator.wire import Event, NtfyError

TOPIC = re.compile(r"[-_A-Za-z0-9]{1,64}", re.ASCII)
DISALLOWED_TOPICS = frozenset(
    {"docs", "static", "file", "app", "metrics", "account", "settings", "signup", "login", "v1"}
)
_URL = re.compile(r"https?://")
_NOT_IMPLEMENTED = "not implemented by the ntfy-intake emulator"
_JSON_STRING_FIELDS = (
    "topic",
    "title",
    "message",
    "click",
    "icon",
    "attach",
    "filename",
    "email",
    "call",
    "cache",
    "firebase",
    "delay",
    "sequence_id",
)
_JSON_HEADERS = {
    "title": "X-Title",
    "attach": "X-Attach",
    "filename": "X-Filename",
    "click": "X-Click",
    "icon": "X-Icon",
    "email": "X-Email",
    "delay": "X-Delay",
    "call": "X-Call",
    "cache": "X-Cache",
    "firebase": "X-Firebase",
    "sequence_id": "X-Sequence-ID",
}


@dataclass(frozen=True)
class Published:
    event: Event
    cache: bool
    delayed: bool = False  # held back until `event.time` (ntfy's published = 0)


SEQUENCE_ID_INVALID = NtfyError(40049, 400, "invalid request: sequence ID invalid")


def build_event(
    topic: str,
    params: Params,
    body: bytes,
    *,
    now_ns: int,
    cache_duration: float,
    size_limit: int,
    sequences: bool = True,
    sequence_id: str = "",
) -> Published:
    """parsePublishParams + handlePublishBody. Raises NtfyError.

    `sequences` (ntfy 2.16+) reads a sequence id from the path (`sequence_id`) or from
    `X-Sequence-ID`/`Sequence-ID`/`SID`; without one the message's own id is its sequence id.
    """
    if sequences:
        sequence_id = sequence_id or params.get("x-sequence-id", "sequence-id", "sid")
        if sequence_id and TOPIC.fullmatch(sequence_id) is None:
            raise SEQUENCE_ID_INVALID
    else:
        sequence_id = ""
    cache = params.get_bool(True, "x-cache", "cache")
    title = params.get("x-title", "title", "t")
    click = params.get("x-click", "click")
    icon = params.get("x-icon", "icon")
    filename = params.get("x-filename", "filename", "file", "f")
    attach = params.get("x-attach", "attach", "a")
    attachment: dict[str, str] | None = None
    if attach or filename:
        attachment = {"name": filename}
    if attach and attachment is not None:
        if _URL.match(attach) is None:
            raise wire.ATTACHMENT_URL_INVALID
        attachment["url"] = attach
        attachment["name"] = attachment["name"] or _url_base_name(attach) or "attachment"
    if icon and _URL.match(icon) is None:
        raise wire.ICON_URL_INVALID
    if params.get("x-email", "x-e-mail", "email", "e-mail", "mail", "e"):
        raise wire.EMAIL_DISABLED
    if params.get("x-call", "call"):
        raise wire.PHONE_CALLS_DISABLED
    message = params.get("x-message", "message", "m").replace("\\n", "\n")
    try:
        priority = parse_priority(params.get("x-priority", "priority", "prio", "p"))
    except ValueError:
        raise wire.PRIORITY_INVALID from None
    tags = tuple(params.get_list("x-tags", "tags", "tag", "ta"))
    now = now_ns // 1_000_000_000
    due = now
    delay = params.get("x-delay", "delay", "x-at", "at", "x-in", "in")
    if delay:
        if not cache:
            raise schedule.DELAY_NO_CACHE
        due = schedule.due_time(delay, now_ns)
    actions_value = params.get("x-actions", "actions", "action")
    actions = parse_actions_param(actions_value) if actions_value else ()
    markdown = params.get_bool(False, "x-markdown", "markdown", "md")
    content_type = params.get("content-type", "content_type")
    # templateMode: any non-empty value turns templating on; a boolean one (even "no") is inline
    # mode, anything else names a template file (ntfy >= 2.14).
    template = params.get("x-template", "template", "tpl")
    unifiedpush = params.get_bool(False, "x-unifiedpush", "unifiedpush", "up")
    unifiedpush = unifiedpush or params.get("content-encoding") == "aes128gcm"
    poll_id = params.get("x-poll-id", "poll-id")
    if poll_id:
        # A poll request replaces the message: fresh id, fixed text, never cached.
        return Published(
            Event(
                id=wire.new_id(),
                time=now,
                event=wire.POLL_REQUEST,
                topic=topic,
                message="New message",
                poll_id=poll_id,
            ),
            cache=False,
        )
    encoding = ""
    peeked = body[:size_limit]
    if unifiedpush:
        if _is_utf8(peeked):
            message = peeked.decode("utf-8")
        else:
            message, encoding = base64.b64encode(peeked).decode("ascii"), "base64"
    elif attachment is not None and "url" in attachment:
        message = _text_body(peeked, message)
        if message == "":
            message = f"You received a file: {attachment['name']}"
    elif attachment is not None:
        raise wire.ATTACHMENTS_DISALLOWED
    elif template and templates.is_inline(template):
        raise wire.TEMPLATE_INVALID.wrap(f"inline templates are {_NOT_IMPLEMENTED}")
    elif template:
        rendered = templates.render(template, body, size_limit)
        title, message = rendered.title, rendered.message
    elif len(body) >= size_limit or not _is_utf8(body):
        raise wire.ATTACHMENTS_DISALLOWED
    else:
        message = _text_body(body, message)
    message_id = wire.new_id()
    event = Event(
        id=message_id,
        time=due,
        event=wire.MESSAGE,
        topic=topic,
        expires=int(due + cache_duration) if cache else 0,
        title=title,
        message=message or wire.EMPTY_MESSAGE_BODY,
        priority=priority,
        tags=tags,
        click=click,
        icon=icon,
        actions=actions,
        attachment=tuple((attachment or {}).items()),
        content_type="text/markdown" if markdown or content_type.lower() == "text/markdown" else "",
        encoding=encoding,
        sequence_id=(sequence_id or message_id) if sequences else "",
    )
    return Published(event, cache, delayed=due > now)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _text_body(body: bytes, message: str) -> str:
    """handleBodyAsTextMessage: a non-empty body replaces the message parameter, trimmed."""
    if not _is_utf8(body):
        raise wire.MESSAGE_NOT_UTF8
    return go_trim(body.decode("utf-8")) if body else message


def _url_base_name(url: str) -> str:
    """path.Base of the URL's path, with '.' and '/' meaning 'no name'."""
    try:
        path = unquote(urlsplit(url).path)
    except ValueError:
        return ""
    stripped = path.rstrip("/")
    if stripped == "":
        return ""
    return stripped.rsplit("/", 1)[-1]


def parse_json_publish(body: bytes, size_limit: int) -> tuple[str, dict[str, str], bytes]:
    """transformBodyJSON: the topic, the headers it sets, and the body (the message) it leaves."""
    if len(body) >= 2 * size_limit:
        raise wire.JSON_TOO_LARGE
    fields = _decode_json_object(body)
    topic = str(fields.get("topic") or "")
    if TOPIC.fullmatch(topic) is None:
        raise wire.TOPIC_INVALID
    headers = {header: str(fields[key]) for key, header in _JSON_HEADERS.items() if fields.get(key)}
    if fields.get("priority"):
        headers["X-Priority"] = str(fields["priority"])
    if fields.get("tags"):
        headers["X-Tags"] = ",".join(fields["tags"])
    if fields.get("markdown"):
        headers["X-Markdown"] = "yes"
    if fields.get("actions"):
        try:
            actions = actions_from_json_values(_plain(fields["actions"]))
        except TypeError:
            raise wire.JSON_INVALID from None
        headers["X-Actions"] = wire.go_json(actions)
    message = str(fields.get("message") or "") or wire.EMPTY_MESSAGE_BODY
    return topic, headers, message.encode("utf-8")


def _decode_json_object(body: bytes) -> dict[str, Any]:
    """Go's json.Decoder into the publishMessage struct: first value only, keys case-insensitive,
    wrong types rejected (400, code 40024)."""
    text = body.decode("utf-8", "replace").lstrip(" \t\r\n")
    try:
        value, _ = json.JSONDecoder(
            object_pairs_hook=_Pairs, parse_constant=_reject_constant
        ).raw_decode(text)
    except ValueError:
        raise wire.JSON_INVALID from None
    if value is None:
        return {}
    if not isinstance(value, _Pairs):
        raise wire.JSON_INVALID
    value = _go_strings(value)
    fields: dict[str, Any] = {}
    known = {*_JSON_STRING_FIELDS, "priority", "tags", "markdown", "actions"}
    for key, item in value:
        name = key.lower()
        if name in known and item is not None:
            _check_json_type(name, item)
            fields[name] = [t or "" for t in item] if name == "tags" else item
    return fields


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs in order (so later duplicates win, as in Go)."""


def _go_strings(value: Any) -> Any:
    """Decoded JSON with every string (keys too) as Go's decoder leaves it (`wire.go_string`:
    a lone surrogate escape is U+FFFD)."""
    if isinstance(value, str):
        return wire.go_string(value)
    if isinstance(value, _Pairs):
        return _Pairs((wire.go_string(key), _go_strings(item)) for key, item in value)
    if isinstance(value, list):
        return [_go_strings(item) for item in value]
    return value


def _plain(value: Any) -> Any:
    """Decoded JSON with every object as a dict (later duplicate keys win)."""
    if isinstance(value, _Pairs):
        return {key: _plain(item) for key, item in value}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _check_json_type(name: str, item: object) -> None:
    if name in _JSON_STRING_FIELDS:
        ok = isinstance(item, str)
    elif name == "priority":
        ok = type(item) is int and -(1 << 63) <= item < 1 << 63
    elif name == "tags":
        ok = isinstance(item, list) and all(t is None or isinstance(t, str) for t in item)
    elif name == "markdown":
        ok = isinstance(item, bool)
    else:
        ok = isinstance(item, list)
    if not ok:
        raise wire.JSON_INVALID


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")
