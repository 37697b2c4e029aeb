"""Admission (`primary.admission`): every bad open, configure or PUT becomes
a coded refusal, never an exception; no node, no sockets."""

import pytest

from conf import parse_domain
from primary.admission import Open, Refusal, check_capacity, check_open, check_put, consumer_options
from primary.dispatcher import ConsumerOptions
from protocol import ResultCode, pb

pytestmark = pytest.mark.unit

DOMAINS = {"d": parse_domain("d", {"max_payload_bytes": 100, "max_consumers": 2}),
           "fan": parse_domain("fan", {"mode": "fanout", "app_ids": ["a", "b"]})}


def refusal(result) -> tuple[ResultCode, str]:
    assert isinstance(result, Refusal), result
    return result.code, result.message


@pytest.mark.parametrize("req, code, words", [
    (pb.OpenQueue(uri="nope", write=True), ResultCode.INVALID_ARGUMENT, "taproot://"),
    (pb.OpenQueue(uri="taproot://x/q", write=True), ResultCode.REFUSED, "unknown domain 'x'"),
    (pb.OpenQueue(uri="taproot://d/q"), ResultCode.INVALID_ARGUMENT, "read, write or both"),
    (pb.OpenQueue(uri="taproot://d/q?id=a", read=True), ResultCode.INVALID_ARGUMENT, "only for fanout"),
    (pb.OpenQueue(uri="taproot://fan/q?id=a", write=True), ResultCode.INVALID_ARGUMENT, "without ?id="),
    (pb.OpenQueue(uri="taproot://fan/q", read=True), ResultCode.INVALID_ARGUMENT, "apps: a, b"),
    (pb.OpenQueue(uri="taproot://fan/q?id=z", read=True), ResultCode.REFUSED, "unknown app id 'z'"),
    (pb.OpenQueue(uri="taproot://d/q", read=True, options=pb.QueueOptions(max_unconfirmed_messages=-1)),
     ResultCode.INVALID_ARGUMENT, ">= 0"),
    (pb.OpenQueue(uri="taproot://d/q", read=True, options=pb.QueueOptions(consumer_priority=2**31 - 1)),
     ResultCode.INVALID_ARGUMENT, "consumer_priority"),
    (pb.OpenQueue(uri="taproot://d/q", read=True, options=pb.QueueOptions(subscriptions=["region ="])),
     ResultCode.INVALID_ARGUMENT, "subscription 'region ='"),
])
def test_a_bad_open_is_a_coded_refusal(req, code, words):
    got_code, message = refusal(check_open(req, DOMAINS))
    assert got_code == code and words in message


def test_a_good_open_carries_the_domains_consumer_defaults():
    checked = check_open(pb.OpenQueue(uri="taproot://fan/q?id=b", read=True), DOMAINS)
    assert isinstance(checked, Open) and checked.uri.app_id == "b" and checked.domain.name == "fan"
    assert (checked.options.max_unconfirmed_messages, checked.options.max_unconfirmed_bytes) == (
        DOMAINS["fan"].max_unconfirmed_messages_default, DOMAINS["fan"].max_unconfirmed_bytes_default)
    options = consumer_options(pb.QueueOptions(max_unconfirmed_messages=5, subscriptions=["n > 1"]),
                               ConsumerOptions())
    assert isinstance(options, ConsumerOptions) and options.max_unconfirmed_messages == 5
    assert [s.text for s in options.subscriptions] == ["n > 1"]


@pytest.mark.parametrize("message, words", [
    (pb.PutMessage(guid=b"short", payload=b"x"), "GUID must be 16 bytes, got 5"),
    (pb.PutMessage(guid=bytes(16), payload=b"x" * 101), "payload of 101 bytes exceeds"),
    (pb.PutMessage(guid=bytes(16), payload=b"x", compression=99), "unknown compression 99"),  # type: ignore[arg-type]
    (pb.PutMessage(guid=bytes(16), payload=b"x",
                   properties=[pb.Property(name="", string_value="v")]), "name"),
    # Timestamps no table reader can hold: one such PUT once took its partition down for good.
    (pb.PutMessage(guid=bytes(16), payload=b"x", put_time_us=10**16), "put_time_us 10000000000000000 is outside"),
    (pb.PutMessage(guid=bytes(16), payload=b"x", put_time_us=2**63 - 1), "2262-04-11"),
    (pb.PutMessage(guid=bytes(16), payload=b"x", put_time_us=-(2**63)), "put_time_us"),
    (pb.PutMessage(guid=bytes(16), payload=b"x", put_time_us=-1), "put_time_us"),
])
def test_a_bad_put_is_refused_invalid_argument(message, words):
    code, text = refusal(check_put(message, DOMAINS["d"]))
    assert code == ResultCode.INVALID_ARGUMENT and words in text


def test_a_good_put_passes_and_capacity_counts_per_queue():
    assert check_put(pb.PutMessage(guid=bytes(16), payload=b"x" * 100), DOMAINS["d"]) is None
    for t in (0, 1_795_000_000_000_000, (2**63 - 1) // 1000):   # unset, now, the last representable
        assert check_put(pb.PutMessage(guid=bytes(16), payload=b"x", put_time_us=t), DOMAINS["d"]) is None
    assert check_capacity(DOMAINS["d"], "taproot://d/q", read=True, write=False, consumers=1, producers=0) is None
    code, text = refusal(check_capacity(DOMAINS["d"], "taproot://d/q", True, False, consumers=2, producers=0))
    assert code == ResultCode.REFUSED and "allows at most 2 (max_consumers)" in text
