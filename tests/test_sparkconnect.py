"""`taproot sql`'s thin Spark Connect client (`taproot_ops.sparkconnect`):
its messages are Spark's on the wire. Each field it declares has the number
and type of pyspark's generated classes (the server's schema), and a request
it builds reads back the same through pyspark's own classes."""

from __future__ import annotations

import pytest

from taproot_ops.sparkconnect import client
from taproot_ops.sparkconnect import connect_subset_pb2 as ours

pytestmark = pytest.mark.unit

MESSAGES = ["UserContext", "Plan", "Relation", "SQL", "Limit", "Project", "ShowString", "Expression",
            "Expression.UnresolvedFunction", "Expression.UnresolvedStar", "ExecutePlanRequest",
            "ExecutePlanResponse", "ExecutePlanResponse.ArrowBatch", "ExecutePlanResponse.ResultComplete",
            "ReleaseSessionRequest", "ReleaseSessionResponse"]


def _message(module, dotted: str):
    found = module
    for part in dotted.split("."):
        found = getattr(found, part)
    return found


def test_every_field_has_sparks_number_type_and_message():
    spark = pytest.importorskip("pyspark.sql.connect.proto")
    for name in MESSAGES:
        mine, theirs = _message(ours, name).DESCRIPTOR, _message(spark, name).DESCRIPTOR
        for field in mine.fields:
            other = theirs.fields_by_name[field.name]
            assert (field.number, field.type, field.is_repeated) == (other.number, other.type, other.is_repeated), \
                f"{name}.{field.name}"
            if field.message_type is not None:
                assert field.message_type.full_name.replace("taproot.sparkconnect.", "spark.connect.") == \
                    other.message_type.full_name, f"{name}.{field.name}"
            if field.containing_oneof is not None:
                assert other.containing_oneof is not None and \
                    field.containing_oneof.name == other.containing_oneof.name, f"{name}.{field.name}"


def test_a_request_reads_back_through_pysparks_classes():
    spark = pytest.importorskip("pyspark.sql.connect.proto")
    relation = client.show_string(client.as_json(client.limit(client.sql("SELECT 1 AS x"), 5)), 20, 0, True)
    request = ours.ExecutePlanRequest(session_id="s", user_context=ours.UserContext(user_id="u"),
                                      plan=ours.Plan(root=relation), client_type="t", operation_id="o")
    parsed = spark.ExecutePlanRequest.FromString(request.SerializeToString())
    show = parsed.plan.root.show_string
    assert (show.num_rows, show.truncate, show.vertical) == (20, 0, True)
    project = show.input.project
    to_json = project.expressions[0].unresolved_function
    assert to_json.function_name == "to_json"
    assert to_json.arguments[0].unresolved_function.function_name == "struct"
    assert to_json.arguments[0].unresolved_function.arguments[0].HasField("unresolved_star")
    assert project.input.limit.limit == 5 and project.input.limit.input.sql.query == "SELECT 1 AS x"
    assert (parsed.session_id, parsed.user_context.user_id, parsed.client_type, parsed.operation_id) == \
        ("s", "u", "t", "o")


def test_urls():
    assert client.Url.parse("sc://127.0.0.1:30127") == client.Url("127.0.0.1", 30127)
    assert client.Url.parse("sc://h/;token=t;user_id=me") == client.Url("h", client.DEFAULT_PORT, "t", "me")
    assert client.Url.parse("sc://[::1]:9/").target == "[::1]:9"
    for bad, said in (("http://h:1", "starts with sc://"), ("sc://:1", "no host"), ("sc://h:x", "not a number")):
        with pytest.raises(ValueError, match=said):
            client.Url.parse(bad)


def test_nothing_answering_is_an_error_with_a_code():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]        # closed again: nothing listens there
    with client.Endpoint(f"sc://127.0.0.1:{port}", timeout_s=5) as endpoint:
        with pytest.raises(client.ConnectError) as err:
            endpoint.sql("SELECT 1")
    assert err.value.code == "UNAVAILABLE"


def test_a_bad_remote_url_is_refused_before_anything_starts(capsys):
    from taproot_ops.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["sql", "--remote", "http://db:15002", "SELECT 1"])
    assert exit_.value.code == 2
    assert "'http://db:15002': a Spark Connect URL starts with sc://" in capsys.readouterr().err
