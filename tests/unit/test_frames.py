from __future__ import annotations

import base64
import json
import re

from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.wire.frames import (
    MAX_LINE_BYTES,
    MAX_MESSAGE_BYTES,
    DeviceAction,
    Ignored,
    Junk,
    Keepalive,
    Message,
    NdjsonDecoder,
    Open,
    decode_line,
)

TOPICS = frozenset({"alerts", "backups"})


def line(**fields: object) -> bytes:
    base: dict[str, object] = {
        "id": "abcDEF123456",
        "time": 1764470000,
        "expires": 1764513200,
        "event": "message",
        "topic": "alerts",
        "message": "disk full",
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


def test_partial_lines_are_joined_across_chunks() -> None:
    decoder = NdjsonDecoder()
    assert decoder.feed(b'{"event":"op') == []
    assert decoder.feed(b'en","topic":"a"}\n{"x"') == [b'{"event":"open","topic":"a"}']
    assert decoder.pending_bytes == 4


def test_blank_lines_are_skipped() -> None:
    assert NdjsonDecoder().feed(b"\n\n  \n{}\n") == [b"{}"]


def test_over_long_line_becomes_junk_and_stream_continues() -> None:
    decoder = NdjsonDecoder(max_line=10)
    out = decoder.feed(b"x" * 25)
    assert len(out) == 1 and isinstance(out[0], Junk)
    assert decoder.feed(b"yyy\n{}\n") == [b"{}"]


@given(st.binary(max_size=300), st.lists(st.integers(min_value=1, max_value=50), max_size=20))
def test_any_chunking_yields_the_same_lines(data: bytes, cuts: list[int]) -> None:
    whole = NdjsonDecoder().feed(data)
    decoder = NdjsonDecoder()
    pieces: list[bytes | Junk] = []
    position = 0
    for cut in cuts:
        pieces += decoder.feed(data[position : position + cut])
        position += cut
    pieces += decoder.feed(data[position:])
    assert pieces == whole


def test_open_and_keepalive() -> None:
    assert decode_line(b'{"id":"x","time":1,"event":"open","topic":"a,b"}', TOPICS) == Open(
        "a,b", 1
    )
    assert isinstance(decode_line(b'{"event":"keepalive","topic":"a"}', TOPICS), Keepalive)


def test_valid_message_is_decoded_with_canonical_body() -> None:
    frame = decode_line(line(title="Disk", priority=4, tags=["warning"]), TOPICS)
    assert isinstance(frame, Message)
    assert (frame.id, frame.topic, frame.title, frame.priority, frame.tags) == (
        "abcDEF123456",
        "alerts",
        "Disk",
        4,
        ("warning",),
    )
    assert frame.cached
    reordered = json.dumps(
        dict(reversed(list(json.loads(line(title="Disk", priority=4, tags=["warning"])).items())))
    )
    again = decode_line(reordered.encode(), TOPICS)
    assert isinstance(again, Message) and again.raw_sha256 == frame.raw_sha256


def test_message_without_expires_is_not_cacheable() -> None:
    frame = decode_line(line(expires=None), TOPICS)
    assert isinstance(frame, Message) and not frame.cached


def test_default_priority_is_three() -> None:
    frame = decode_line(line(), TOPICS)
    assert isinstance(frame, Message) and frame.effective_priority == 3


BAD = [
    (b"not json", "not JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"id":"abcDEF123456"}', "missing or non-string 'event'"),
    (b'{"event":"poll_request"}', "event kind 'poll_request' without a 12-character id"),
    (line(event="message_delete"), "message_delete without a valid 'sequence_id'"),
    (line(sequence_id="bad seq"), "'sequence_id' is not a valid sequence id"),
    (line(id="short"), "'id' is not 12 characters"),
    (line(time=True), "'time' is not a positive integer"),
    (line(time="1764470000"), "'time' is not a positive integer"),
    (line(expires=1.5), "'expires' is not a positive integer"),
    (line(priority=True), "'priority' is not an integer from 1 to 5"),
    (line(priority=9), "'priority' is not an integer from 1 to 5"),
    (line(tags="a,b"), "'tags' is not a list of strings"),
    (line(tags=[1]), "'tags' is not a list of strings"),
    (line(title=5), "'title' is not a string"),
    (line(message=None) + b"", None),
    (line(topic="other"), "topic 'other' is not subscribed"),
    (line(topic="bad topic"), "'topic' is not a valid topic name"),
    (b"\xff\xfe", "not UTF-8"),
]


def test_bad_frames_become_junk_with_a_reason() -> None:
    for raw, reason in BAD:
        frame = decode_line(raw, TOPICS)
        if reason is None:
            assert isinstance(frame, Message), raw
            continue
        assert isinstance(frame, Junk), raw
        assert frame.reason.startswith(reason), (raw, frame.reason)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    decode_line(data, TOPICS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "id",
                "time",
                "expires",
                "event",
                "topic",
                "title",
                "message",
                "priority",
                "tags",
                "sequence_id",
                "encoding",
            ]
        ),
        json_values,
    )
)
def test_arbitrary_objects_decode_to_a_frame_or_junk(obj: dict[str, object]) -> None:
    frame = decode_line(json.dumps(obj).encode(), TOPICS)
    assert isinstance(frame, Open | Keepalive | Message | DeviceAction | Ignored | Junk)


@given(
    st.sampled_from(["message_delete", "message_clear", "poll_request", "x-new-kind"]),
    st.dictionaries(st.sampled_from(["sequence_id", "time", "expires", "topic"]), json_values),
)
def test_new_event_kinds_never_raise_and_keep_their_id(kind: str, extra: dict[str, object]) -> None:
    obj = {"id": "abcDEF123456", "event": kind, **extra}
    frame = decode_line(json.dumps(obj).encode(), TOPICS)
    assert isinstance(frame, DeviceAction | Ignored | Junk)
    assert frame.event_id == "abcDEF123456" if isinstance(frame, Junk) else frame.id


def test_unknown_event_kind_is_ignored_not_junk() -> None:
    frame = decode_line(line(event="message_pin"), TOPICS)
    assert isinstance(frame, Ignored)
    assert (frame.id, frame.kind, frame.cached) == ("abcDEF123456", "message_pin", False)


def test_delete_and_clear_name_their_message_by_sequence_id() -> None:
    for kind in ("message_delete", "message_clear"):
        frame = decode_line(line(event=kind, sequence_id="origID123456", message=None), TOPICS)
        assert isinstance(frame, DeviceAction)
        assert (frame.kind, frame.sequence_id, frame.topic) == (kind, "origID123456", "alerts")


def test_update_carries_the_sequence_it_belongs_to() -> None:
    update = decode_line(line(sequence_id="origID123456"), TOPICS)
    original = decode_line(line(sequence_id="abcDEF123456"), TOPICS)  # /ws sends it even if equal
    assert isinstance(update, Message) and update.sequence == "origID123456"
    assert isinstance(original, Message) and original.sequence_id is None
    assert original.sequence == "abcDEF123456"


def test_base64_body_is_decoded_before_the_envelope_is_read_and_raw_frame_kept() -> None:
    body = '{"incident":"nas-raid","severity":5}'
    encoded = base64.b64encode(body.encode()).decode()
    frame = decode_line(line(message=encoded, encoding="base64"), TOPICS)
    assert isinstance(frame, Message) and frame.message == body
    assert encoded in frame.raw and json.loads(frame.raw)["encoding"] == "base64"


def test_base64_body_that_is_not_utf8_or_not_base64_loses_nothing() -> None:
    binary = decode_line(
        line(message=base64.b64encode(b"\xff\xfeok").decode(), encoding="base64"), TOPICS
    )
    assert isinstance(binary, Message) and binary.message.endswith("ok")
    broken = decode_line(line(message="not base64!", encoding="base64"), TOPICS)
    assert isinstance(broken, Message) and broken.message == "not base64!"


def test_largest_configurable_message_with_json_escaping_is_accepted() -> None:
    # ntfy's Go encoder writes `<` as \u003c: six bytes each, at the 5 MiB message limit.
    body = "<" * MAX_MESSAGE_BYTES
    raw = json.dumps({**json.loads(line()), "message": body}).replace("<", "\\u003c").encode()
    assert len(raw) > 6 * MAX_MESSAGE_BYTES and len(raw) <= MAX_LINE_BYTES
    decoder = NdjsonDecoder()
    lines: list[bytes | Junk] = []
    for start in range(0, len(raw), 65536):
        lines += decoder.feed(raw[start : start + 65536])
    lines += decoder.feed(b"\n")
    assert len(lines) == 1 and isinstance(lines[0], bytes)
    frame = decode_line(lines[0], TOPICS)
    assert isinstance(frame, Message) and frame.message == body


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(r"\\u[0-9a-f]{4}")
# st.text() leaves lone surrogates out even when its alphabet has them: lists of characters do not.
_surrogate_text = st.lists(
    st.one_of(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.characters()),
    max_size=8,
).map("".join)


@given(
    title=_surrogate_text,
    message=_surrogate_text,
    tag=_surrogate_text,
    upper=st.booleans(),
)
def test_a_lone_surrogate_escape_in_either_case_never_reaches_a_decoded_field(
    title: str, message: str, tag: str, upper: bool
) -> None:
    """Decoding skips the surrogate walk for a line without a surrogate escape: whatever the
    case of the escape's hex digits, a lone surrogate must still be replaced."""
    text = line(title=title, message=message, tags=[tag]).decode()
    if upper:
        text = _ESCAPE.sub(lambda m: m.group(0)[:2] + m.group(0)[2:].upper(), text)
    frame = decode_line(text.encode(), TOPICS)
    assert isinstance(frame, Message), frame
    for field in (frame.title or "", frame.message, *frame.tags):
        assert not _SURROGATE.search(field), field
    # The stored raw keeps what was sent (as canonical JSON), surrogates and all.
    assert json.loads(frame.raw) == json.loads(text)
