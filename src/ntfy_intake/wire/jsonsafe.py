"""JSON from the network, decoded so that no value in it can crash the code that reads it.

`loads` turns every way a body can be bad into one `BadJson` (a ValueError): not UTF-8, not JSON,
NaN/Infinity, or nested deeper than `MAX_DEPTH` (CPython's decoder raises RecursionError, not a
ValueError, near its recursion limit). Strings come back valid UTF-8: lone surrogates, which JSON
allows as `\\ud83d` escapes but SQLite and every UTF-8 writer refuse, are replaced by U+FFFD, or
refused with `strict=True` where the sender can be told to fix its request.

Pure. The decoder's own RecursionError is caught; the walk that checks depth and strings is
iterative, so nothing here recurses on a deep body.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 64
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class BadJson(ValueError):
    """The body is not acceptable JSON; the message says why in a few words."""


def _reject_constant(name: str) -> object:
    raise BadJson(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf, which no JSON writer can emit again
        raise BadJson(f"the number {text[:20]} is out of range")
    return value


def valid_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def has_surrogates(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def loads(raw: bytes, *, strict: bool = False, max_depth: int = MAX_DEPTH) -> object:
    """Decode `raw`; strings made valid (or, with `strict`, a lone surrogate is a BadJson)."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except BadJson:
        raise
    except RecursionError:
        raise BadJson(f"nested deeper than {max_depth} levels") from None
    except UnicodeDecodeError:
        raise BadJson("not UTF-8") from None
    except ValueError as exc:
        raise BadJson(f"not JSON: {exc}") from None
    return _clean(value, strict=strict, max_depth=max_depth)


def _clean(value: object, *, strict: bool, max_depth: int) -> object:
    def fix(text: str) -> str:
        if strict and has_surrogates(text):
            raise BadJson("a string holds a lone surrogate (invalid Unicode)")
        return valid_text(text)

    if isinstance(value, str):
        return fix(value)
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise BadJson(f"nested deeper than {max_depth} levels")
        if isinstance(node, dict):
            for key in list(node):
                item = node[key]
                if isinstance(key, str) and has_surrogates(key):
                    del node[key]
                    key = fix(key)  # noqa: PLW2901 - the cleaned key replaces the bad one
                if isinstance(item, str):
                    item = fix(item)
                elif isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                node[key] = item
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = fix(item)
                elif isinstance(item, dict | list):
                    stack.append((item, depth + 1))
    return value


def compact_encoder(*, sort_keys: bool) -> Callable[[Any], str]:
    """`json.dumps(value, separators=(",", ":"), ensure_ascii=True, sort_keys=sort_keys)`, its
    encoder built once."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, sort_keys=sort_keys)
    return encoder.encode
