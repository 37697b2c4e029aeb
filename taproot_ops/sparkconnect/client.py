"""A thin Spark Connect client for `taproot sql`: one gRPC call per query,
Arrow batches back, no pandas and no pyspark import.

PySpark's own Connect client costs 0.55-0.7 s to import here (it checks for
pandas, and imports it, before anything else), more than a query on the
warm endpoint takes. This one speaks the few messages `taproot sql` needs
(`connect_subset.proto`): a SQL relation, wrapped in ShowString (Spark's
own table text, what `DataFrame.show` prints), Limit and Project
(`to_json(struct(*))`), answered by Arrow IPC streams. A notebook uses
pyspark's client against the same endpoint; this one is not a general
client and does not pretend to be.

The URL is Spark Connect's: `sc://host:port[/;token=...;user_id=...]`. A
token goes as `authorization: Bearer <token>`, what the server checks when
`spark.connect.authenticate.token` is set (the pipeline sets it with
[auth] on)."""

from __future__ import annotations

import getpass
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa

from taproot_ops.sparkconnect import connect_subset_pb2 as pb

SERVICE = "/spark.connect.SparkConnectService/"
CLIENT_TYPE = "taproot-sql"
MAX_MESSAGE = 128 * 1024 * 1024          # the server's default spark.connect.grpc.maxInboundMessageSize
DEFAULT_PORT = 15002                     # Spark Connect's, when a URL names none


class ConnectError(Exception):
    """A call the endpoint refused or could not answer: `code` is gRPC's
    status name (UNAVAILABLE: nothing answers; UNAUTHENTICATED: a token is
    missing or wrong; INTERNAL and others: Spark's error, whose first line
    names its error class, e.g. [TABLE_OR_VIEW_NOT_FOUND])."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Url:
    host: str
    port: int
    token: str | None = None
    user_id: str | None = None

    @classmethod
    def parse(cls, url: str) -> "Url":
        """`sc://host:port/;key=value;...`; a ValueError names what is wrong."""
        if not url.startswith("sc://"):
            raise ValueError(f"{url!r}: a Spark Connect URL starts with sc://")
        where, _, params = url[len("sc://"):].partition("/")
        if where.startswith("["):                     # [IPv6]:port
            host, _, rest = where[1:].partition("]")
            port = rest.removeprefix(":") or str(DEFAULT_PORT)
        else:
            host, _, port = where.partition(":")
            port = port or str(DEFAULT_PORT)
        if not host:
            raise ValueError(f"{url!r}: no host")
        try:
            number = int(port)
        except ValueError:
            raise ValueError(f"{url!r}: port {port!r} is not a number") from None
        options = dict(p.split("=", 1) for p in params.split(";") if "=" in p)
        return cls(host, number, options.get("token"), options.get("user_id"))

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _relation(**kind: Any) -> pb.Relation:
    return pb.Relation(**kind)


def sql(query: str) -> pb.Relation:
    return _relation(sql=pb.SQL(query=query))


def limit(relation: pb.Relation, n: int) -> pb.Relation:
    return _relation(limit=pb.Limit(input=relation, limit=n))


def show_string(relation: pb.Relation, rows: int, truncate: int, vertical: bool) -> pb.Relation:
    return _relation(show_string=pb.ShowString(input=relation, num_rows=rows, truncate=truncate,
                                               vertical=vertical))


def as_json(relation: pb.Relation) -> pb.Relation:
    """Each row as one JSON text: `to_json(struct(*))`."""
    fn = pb.Expression.UnresolvedFunction
    star = pb.Expression(unresolved_star=pb.Expression.UnresolvedStar())
    struct = pb.Expression(unresolved_function=fn(function_name="struct", arguments=[star]))
    to_json = pb.Expression(unresolved_function=fn(function_name="to_json", arguments=[struct]))
    return _relation(project=pb.Project(input=relation, expressions=[to_json]))


class Endpoint:
    """One Spark Connect session on `url`; `close()` releases it on the server."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 600.0):
        self.url = Url.parse(url)
        self.timeout_s = timeout_s
        self.session_id = str(uuid.uuid4())
        self.user = pb.UserContext(user_id=self.url.user_id or getpass.getuser())
        token = self.url.token or token
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = grpc.insecure_channel(self.url.target, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)])
        self._execute = self.channel.unary_stream(
            SERVICE + "ExecutePlan", request_serializer=pb.ExecutePlanRequest.SerializeToString,
            response_deserializer=pb.ExecutePlanResponse.FromString)
        self._release = self.channel.unary_unary(
            SERVICE + "ReleaseSession", request_serializer=pb.ReleaseSessionRequest.SerializeToString,
            response_deserializer=pb.ReleaseSessionResponse.FromString)
        self._used = False

    def execute(self, relation: pb.Relation) -> pa.Table:
        """The relation's rows (an empty table with its columns when it has none)."""
        request = pb.ExecutePlanRequest(session_id=self.session_id, user_context=self.user,
                                        plan=pb.Plan(root=relation), client_type=CLIENT_TYPE,
                                        operation_id=str(uuid.uuid4()))
        self._used = True
        batches: list[pa.RecordBatch] = []
        schema: pa.Schema | None = None
        try:
            for response in self._execute(request, timeout=self.timeout_s, metadata=self.metadata):
                if response.WhichOneof("response_type") == "arrow_batch":
                    reader = pa.ipc.open_stream(response.arrow_batch.data)
                    schema = schema or reader.schema
                    batches.extend(reader)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return pa.Table.from_batches(batches, schema) if schema is not None else pa.table({})

    def sql(self, query: str) -> pa.Table:
        return self.execute(sql(query))

    def show(self, query: str, rows: int, truncate: int, vertical: bool) -> str:
        """Spark's own table text for the query's first `rows` rows (what `DataFrame.show` prints)."""
        table = self.execute(show_string(sql(query), rows, truncate, vertical))
        return str(table.column(0)[0].as_py()) if table.num_rows else ""

    def json_lines(self, query: str, rows: int) -> list[str]:
        table = self.execute(as_json(limit(sql(query), rows)))
        return [str(v) for v in table.column(0).to_pylist()] if table.num_columns else []

    def columns(self, name: str) -> list[str]:
        """A table's or view's column names (no rows are read)."""
        return list(self.execute(limit(sql(f"SELECT * FROM {name}"), 0)).column_names)

    def close(self) -> None:
        try:
            if self._used:
                self._release(pb.ReleaseSessionRequest(session_id=self.session_id, user_context=self.user,
                                                       client_type=CLIENT_TYPE),
                              timeout=5, metadata=self.metadata)
        except grpc.RpcError:
            pass   # the server drops an idle session on its own
        finally:
            self.channel.close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error(exc: grpc.RpcError) -> ConnectError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return ConnectError(code.name if code is not None else "UNKNOWN", details or str(exc))
