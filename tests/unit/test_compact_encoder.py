"""The prebuilt encoder behind the canonical raw frame and every audit line writes exactly what
`json.dumps` writes: the stored raw, its hash and the audit log must never change."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ntfy_intake.wire.jsonsafe import compact_encoder

# Lone surrogates included (st.text() leaves them out: lists of characters do not), floats of
# every kind json.dumps accepts, integers past 64 bits, nesting.
_text = st.lists(
    st.one_of(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.characters()),
    max_size=10,
).map("".join)
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(value=_values, sort_keys=st.booleans())
def test_compact_encoder_writes_what_json_dumps_writes(value: Any, sort_keys: bool) -> None:
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=True, sort_keys=sort_keys)
    assert compact_encoder(sort_keys=sort_keys)(value) == expected
