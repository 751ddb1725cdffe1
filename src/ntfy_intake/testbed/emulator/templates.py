"""ntfy's named templates: `?template=alertmanager` and `?template=grafana` (ntfy >= 2.14).

ntfy renders a webhook's JSON body through a YAML template file embedded in the server
(`server/templates/alertmanager.yml`, `server/templates/grafana.yml`, unchanged from 2.14 up to
this writing) with Go's text/template and its reduced sprig (`server/server_template.go`,
`renderTemplateFromFile`/`renderTemplate`). This module renders exactly those two templates,
written out as Python rather than interpreted: the emulator needs these two and no other, and a
Go-template interpreter (or a translation to Jinja2, whose missing values, whitespace control
and truthiness all differ from Go's) would be more code to get wrong than the templates
themselves. What is reproduced is Go's behaviour on the decoded JSON (`any`: maps, slices,
float64, strings, bools, nil):
- a missing key prints `<no value>`, a JSON null `<nil>`; a field of a missing value is missing,
  a field of a null is an execution error ("nil pointer evaluating");
- `if` is false for missing, null, "", 0, false, empty lists and objects;
- `eq` of a missing or null value with a string is false; of a number, bool, list or object with a
  string it is an execution error (incompatible types);
- `range` over a missing or null value runs no times, over an object runs over its values in key order,
  over anything else but a list is an execution error;
- a null passed to a function's string parameter is an "invalid value", as a missing one;
- sprig `title` (x/text cases.Title), `first` (error on a non-list, missing on an empty one),
  `default` (sprig's "empty"), `trunc` (bytes, so a cut inside a UTF-8 sequence leaves bytes that
  the JSON output writes as U+FFFD each), `fail`;
- numbers print as Go's `%v` of a float64 (`1e+06`, `18.5`), lists as `[a b]`, objects as
  `map[k:v]`.
Then, as ntfy does: the message is rendered before the title, each result has a literal `\\n`
turned into a newline and is trimmed, and a title or message longer than the message size limit
is refused (40041). Error codes are ntfy's; an execution error's detail names the template part
and the reason as ntfy does, without Go's `template: :line:col: executing ...` position.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ntfy_intake.testbed.emulator import wire
from ntfy_intake.testbed.emulator.params import go_trim
from ntfy_intake.testbed.emulator.wire import NtfyError

_DOCS = "https://ntfy.sh/docs/publish/#message-templating"
TEMPLATE_TOO_LARGE = NtfyError(
    40041, 400, "invalid request: message or title is too large after replacing template", _DOCS
)
TEMPLATE_NOT_JSON = NtfyError(
    40042, 400, "invalid request: message body must be JSON if templating is enabled", _DOCS
)
TEMPLATE_EXECUTE_FAILED = NtfyError(40045, 400, "invalid request: template execution failed", _DOCS)
TEMPLATE_FILE_NOT_FOUND = NtfyError(40047, 400, "invalid request: template file not found", _DOCS)

# ntfy's jsonBodyBytesLimit: a templated body is read up to max(message limit, this); a body that
# reaches it is refused as 413 41303 (`handleBodyAsTemplatedTextMessage`).
JSON_BODY_LIMIT = 131072
# ntfy also ships `github`; the emulator does not render it (a 400 that says so, not "not found").
SHIPPED_NOT_RENDERED = frozenset({"github"})
_BOOL_VALUES = frozenset({"1", "yes", "true", "0", "no", "false"})
_NAME = re.compile(r"[-_A-Za-z0-9]+", re.ASCII)


class _Missing:
    """Go's invalid reflect.Value: what a key absent from the JSON evaluates to."""

    def __repr__(self) -> str:
        return "<no value>"


MISSING: Any = _Missing()


class _ExecError(Exception):
    """An execution error of the Go template (ntfy: 400, 40045)."""


@dataclass(frozen=True)
class Rendered:
    title: str
    message: str


def is_inline(template: str) -> bool:
    """templateMode: a boolean value (`yes`, `1`, `no`, ...) is inline mode, anything else a name."""
    return template in _BOOL_VALUES


def render(name: str, body: bytes, size_limit: int) -> Rendered:
    """handleBodyAsTemplatedTextMessage + renderTemplateFromFile for a named template."""
    if len(body) >= max(size_limit, JSON_BODY_LIMIT):
        raise wire.JSON_TOO_LARGE
    renderers = _RENDERERS.get(name) if _NAME.fullmatch(name) else None
    if renderers is None:
        if name in SHIPPED_NOT_RENDERED:
            raise wire.TEMPLATE_INVALID.wrap(
                f"template {name!r} is not implemented by the ntfy-intake emulator"
            )
        raise TEMPLATE_FILE_NOT_FOUND
    data = _decode(go_trim(_go_text(body)))
    render_message, render_title = renderers
    message = _run(name, "message", render_message, data)
    title = _run(name, "title", render_title, data)
    if _size(title) > size_limit or _size(message) > size_limit:
        raise TEMPLATE_TOO_LARGE
    return Rendered(title=_json_safe(title), message=_json_safe(message))


def _run(name: str, part: str, renderer: Any, data: Any) -> str:
    try:
        text: str = renderer(data)
    except _ExecError as exc:
        raise TEMPLATE_EXECUTE_FAILED.wrap(f"template {name} ({part}): {exc}") from None
    return go_trim(text.replace("\\n", "\n"))


# --- Alertmanager (server/templates/alertmanager.yml) -------------------------------------


def _alertmanager_title(data: Any) -> str:
    status = _field(data, "status", top=True)
    if _eq(status, "firing"):
        return "\n🚨 Alert: " + _first_alertname(data)
    if _eq(status, "resolved"):
        return "\n✅ Resolved: " + _first_alertname(data)
    raise _ExecError("error calling fail: Unsupported Alertmanager status.")


def _first_alertname(data: Any) -> str:
    """`(first .alerts).labels.alertname`"""
    first = _first(_field(data, "alerts", top=True))
    return _text(_field(_field(first, "labels"), "alertname"))


def _alertmanager_message(data: Any) -> str:
    out = [
        "Status: ",
        _title(_string_arg(_field(data, "status", top=True))),
        "\nReceiver: ",
        _text(_field(data, "receiver", top=True)),
    ]
    # `{{- range .alerts }}` trims the blank line before it; each alert ends with a blank line.
    for alert in _range(_field(data, "alerts", top=True)):
        labels = _field(alert, "labels")
        out += ["\nAlert: ", _text(_field(labels, "alertname"))]
        out += ["\nInstance: ", _text(_field(labels, "instance"))]
        out += ["\nSeverity: ", _text(_field(labels, "severity"))]
        out += ["\nStarts at: ", _text(_field(alert, "startsAt"))]
        # The template's `{{- if .endsAt }}` eats the newline, and Alertmanager's firing alerts
        # carry endsAt "0001-01-01T00:00:00Z", which is truthy: ntfy prints
        # "Starts at: <t>Ends at: 0001-01-01T00:00:00Z" (ntfy issue #1940, still open).
        ends_at = _field(alert, "endsAt")
        if _truth(ends_at):
            out += ["Ends at: ", _text(ends_at)]
        summary = _field(_field(alert, "annotations"), "summary")
        if _truth(summary):
            out += ["\nSummary: ", _text(summary)]
        description = _field(_field(alert, "annotations"), "description")
        if _truth(description):
            out += ["\nDescription: ", _text(description)]
        out += ["\nSource: ", _text(_field(alert, "generatorURL")), "\n\n"]
    out.append("\n")
    return "".join(out)


# --- Grafana (server/templates/grafana.yml) -----------------------------------------------


def _grafana_title(data: Any) -> str:
    status = _field(data, "status", top=True)
    title = _field(data, "title", top=True)
    if _eq(status, "firing"):
        return "\n🚨 " + _text(_default("Alert firing", title))
    if _eq(status, "resolved"):
        return "\n✅ " + _text(_default("Alert resolved", title))
    return "\n⚠️ Unknown alert: " + _text(_default("Alert", title))


def _grafana_message(data: Any) -> str:
    return _trunc(2000, _string_arg(_field(data, "message", top=True))) + "\n"


_RENDERERS = {
    "alertmanager": (_alertmanager_message, _alertmanager_title),
    "grafana": (_grafana_message, _grafana_title),
}


# --- Go's text/template on decoded JSON ---------------------------------------------------


def _decode(text: str) -> Any:
    """json.Unmarshal into `any`: every number a float64; no NaN/Infinity; one value only."""
    try:
        value = json.loads(
            text, parse_int=_go_number, parse_float=_go_number, parse_constant=_reject
        )
    except (ValueError, OverflowError):
        raise TEMPLATE_NOT_JSON from None
    return _go_strings(value)


def _go_number(literal: str) -> float:
    number = float(literal)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"{literal} is out of range for a float64")
    return number


def _reject(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _go_strings(value: Any) -> Any:
    if isinstance(value, str):
        return wire.go_string(value)
    if isinstance(value, list):
        return [_go_strings(item) for item in value]
    if isinstance(value, dict):
        return {wire.go_string(key): _go_strings(item) for key, item in value.items()}
    return value


def _go_text(body: bytes) -> str:
    """string(bytes): invalid UTF-8 kept byte for byte (as surrogate escapes) until output."""
    return body.decode("utf-8", "surrogateescape")


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def _json_safe(text: str) -> str:
    """What Go's JSON encoder writes for a string holding invalid UTF-8: U+FFFD per bad byte."""
    return re.sub("[\udc80-\udcff]", "\ufffd", text)


def _go_type(value: Any, top: bool) -> str:
    if not top:
        return "interface {}"  # a value found in a map or a slice has the static type any
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, list):
        return "[]interface {}"
    return {str: "string", bool: "bool", float: "float64"}[type(value)]


def _field(value: Any, name: str, *, top: bool = False) -> Any:
    if value is MISSING:
        return MISSING
    if value is None:
        if top:
            return MISSING  # the data itself is nil: Go returns the zero value, no error
        raise _ExecError(f"nil pointer evaluating interface {{}}.{name}")
    if isinstance(value, dict):
        return value.get(name, MISSING)
    raise _ExecError(f"can't evaluate field {name} in type {_go_type(value, top)}")


def _truth(value: Any) -> bool:
    if value is MISSING or value is None:
        return False
    if isinstance(value, (str, list, dict)):
        return len(value) > 0
    return bool(value)


def _eq(value: Any, text: str) -> bool:
    if value is MISSING or value is None:
        return False
    if isinstance(value, str):
        return value == text
    kind = _go_type(value, top=True)
    raise _ExecError(f"error calling eq: incompatible types for comparison: {kind} and string")


def _range(value: Any) -> list[Any]:
    if value is MISSING or value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return [value[key] for key in sorted(value)]
    raise _ExecError(f"range can't iterate over {_text(value)}")


def _string_arg(value: Any) -> str:
    """A value passed to a function's string parameter."""
    if value is MISSING or value is None:
        raise _ExecError("invalid value; expected string")
    if isinstance(value, str):
        return value
    raise _ExecError(f"wrong type for value; expected string; got {_go_type(value, top=True)}")


def _first(value: Any) -> Any:
    if value is MISSING or value is None:
        raise _ExecError(
            "error calling first: runtime error: invalid memory address or nil pointer dereference"
        )
    if not isinstance(value, list):
        kind = {dict: "map", str: "string", bool: "bool", float: "float64"}[type(value)]
        raise _ExecError(f"error calling first: cannot find first on type {kind}")
    # A nil result (an empty list, a null first element) is then a missing value, not a nil one.
    return value[0] if value and value[0] is not None else MISSING


def _default(fallback: str, given: Any) -> Any:
    return fallback if not _truth(given) else given


def _trunc(count: int, text: str) -> str:
    return text.encode("utf-8", "surrogateescape")[:count].decode("utf-8", "surrogateescape")


def _title(text: str) -> str:
    """cases.Title(language.English): words as Unicode word breaking finds them (letters, digits
    and `_` join; `'`, `.`, `:` between two of those do not break), the first cased character of
    each word in title case, the rest in lower case ("1st" -> "1St", "foo_bar" -> "Foo_bar")."""
    out = []
    in_word = False
    cased_yet = False
    for index, char in enumerate(text):
        if char.isalnum() or char == "_":
            if not in_word:
                in_word, cased_yet = True, False
        elif not (in_word and char in _MID_WORD and _word_char(text, index + 1)):
            in_word = False
        if in_word and char.lower() != char.upper():
            out.append(char.lower() if cased_yet else char.title())
            cased_yet = True
        else:
            out.append(char)
    return "".join(out)


_MID_WORD = frozenset("'.:\u00b7\u2019\u2018\u2024\ufe52\uff07\uff0e\u05f4\u0387\ufe13\ufe55\uff1a")


def _word_char(text: str, index: int) -> bool:
    return index < len(text) and (text[index].isalnum() or text[index] == "_")


def _text(value: Any) -> str:
    """What `{{ value }}` prints (fmt's %v of the Go value)."""
    if value is MISSING:
        return "<no value>"
    return _fmt(value)


def _fmt(value: Any) -> str:
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, list):
        return "[" + " ".join(_fmt(item) for item in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{key}:{_fmt(value[key])}" for key in sorted(value)) + "]"
    return str(value)


def _go_float(number: float) -> str:
    """strconv.FormatFloat(f, 'g', -1, 64): shortest digits, exponent form below 1e-4 or from
    1e+06 on (with at least two exponent digits)."""
    sign = "-" if str(number).startswith("-") else ""
    if number == 0:
        return sign + "0"
    exact = Decimal(repr(abs(number)))
    digits = "".join(str(d) for d in exact.as_tuple().digits).rstrip("0") or "0"
    exponent = exact.adjusted()
    if exponent < -4 or exponent >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    return sign + format(exact.normalize(), "f")
