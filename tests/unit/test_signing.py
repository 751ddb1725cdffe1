"""Standard Webhooks signing: our verify agrees with the package's, and refuses what it should."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

from ntfy_intake.wire import signing

SECRET = signing.new_secret(bytes(range(32)))
KEY = signing.parse_secret(SECRET)


def test_a_signature_verifies_with_the_reference_package_and_with_ours() -> None:
    body = json.dumps({"delivery_key": "tri_x", "text": "Disk full ✓"}).encode()
    now = time.time()
    headers = signing.sign(KEY, "tri_x", body, now)
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(SECRET).verify(body, headers) == json.loads(body)
    assert signing.verify(KEY, headers, body, now) is None


def test_rotation_lists_several_signatures_and_one_match_is_enough() -> None:
    body = b"{}"
    good = signing.sign(KEY, "id", body, 100.0)
    other = signing.sign(bytes(32), "id", body, 100.0)["webhook-signature"]
    headers = {**good, "webhook-signature": f"{other} {good['webhook-signature']}"}
    assert signing.verify(KEY, headers, body, 100.0) is None


@pytest.mark.parametrize("skew", [-301.0, 301.0])
def test_a_timestamp_outside_the_tolerance_is_refused(skew: float) -> None:
    headers = signing.sign(KEY, "id", b"{}", 1000.0)
    assert "tolerance" in (signing.verify(KEY, headers, b"{}", 1000.0 + skew) or "")
    assert signing.verify(KEY, headers, b"{}", 1000.0 + skew / 2) is None


@given(
    st.dictionaries(
        st.sampled_from(["webhook-id", "webhook-timestamp", "webhook-signature", "x"]), st.text()
    ),
    st.binary(max_size=64),
)
def test_verify_never_raises_on_arbitrary_headers_and_bodies(
    headers: dict[str, str], body: bytes
) -> None:
    assert signing.verify(KEY, headers, body, 1000.0) is not None


@pytest.mark.parametrize("text", ["", "whsec_", "whsec_!!!!", "whsec_" + "A" * 8, "sk_abcdef"])
def test_bad_secrets_are_refused(text: str) -> None:
    with pytest.raises(signing.SecretError):
        signing.parse_secret(text)
