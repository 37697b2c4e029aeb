from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[ResultCode]
    UNKNOWN: _ClassVar[ResultCode]
    TIMEOUT: _ClassVar[ResultCode]
    NOT_CONNECTED: _ClassVar[ResultCode]
    CANCELED: _ClassVar[ResultCode]
    NOT_SUPPORTED: _ClassVar[ResultCode]
    REFUSED: _ClassVar[ResultCode]
    INVALID_ARGUMENT: _ClassVar[ResultCode]
    NOT_READY: _ClassVar[ResultCode]
    NO_ROUTE: _ClassVar[ResultCode]
    UNAUTHENTICATED: _ClassVar[ResultCode]
    NOT_AUTHORIZED: _ClassVar[ResultCode]
    LIMIT_MESSAGES: _ClassVar[ResultCode]
    LIMIT_BYTES: _ClassVar[ResultCode]
    STORAGE_FAILURE: _ClassVar[ResultCode]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_ZLIB: _ClassVar[Compression]
    COMPRESSION_ZSTD: _ClassVar[Compression]
SUCCESS: ResultCode
UNKNOWN: ResultCode
TIMEOUT: ResultCode
NOT_CONNECTED: ResultCode
CANCELED: ResultCode
NOT_SUPPORTED: ResultCode
REFUSED: ResultCode
INVALID_ARGUMENT: ResultCode
NOT_READY: ResultCode
NO_ROUTE: ResultCode
UNAUTHENTICATED: ResultCode
NOT_AUTHORIZED: ResultCode
LIMIT_MESSAGES: ResultCode
LIMIT_BYTES: ResultCode
STORAGE_FAILURE: ResultCode
COMPRESSION_NONE: Compression
COMPRESSION_ZLIB: Compression
COMPRESSION_ZSTD: Compression

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ResultCode
    message: str
    def __init__(self, code: _Optional[_Union[ResultCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class QueueOptions(_message.Message):
    __slots__ = ("max_unconfirmed_messages", "max_unconfirmed_bytes", "consumer_priority", "subscriptions")
    MAX_UNCONFIRMED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_UNCONFIRMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    max_unconfirmed_messages: int
    max_unconfirmed_bytes: int
    consumer_priority: int
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_unconfirmed_messages: _Optional[int] = ..., max_unconfirmed_bytes: _Optional[int] = ..., consumer_priority: _Optional[int] = ..., subscriptions: _Optional[_Iterable[str]] = ...) -> None: ...

class OpenQueue(_message.Message):
    __slots__ = ("request_id", "queue_id", "uri", "read", "write", "options", "columnar_push", "push_group", "link")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_PUSH_FIELD_NUMBER: _ClassVar[int]
    PUSH_GROUP_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    uri: str
    read: bool
    write: bool
    options: QueueOptions
    columnar_push: bool
    push_group: int
    link: str
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., uri: _Optional[str] = ..., read: _Optional[bool] = ..., write: _Optional[bool] = ..., options: _Optional[_Union[QueueOptions, _Mapping]] = ..., columnar_push: _Optional[bool] = ..., push_group: _Optional[int] = ..., link: _Optional[str] = ...) -> None: ...

class OpenQueueResponse(_message.Message):
    __slots__ = ("request_id", "queue_id", "status", "max_payload_bytes", "options", "dedup_history_window_ms", "broadcast", "partition")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_HISTORY_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    status: Status
    max_payload_bytes: int
    options: QueueOptions
    dedup_history_window_ms: int
    broadcast: bool
    partition: int
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., max_payload_bytes: _Optional[int] = ..., options: _Optional[_Union[QueueOptions, _Mapping]] = ..., dedup_history_window_ms: _Optional[int] = ..., broadcast: _Optional[bool] = ..., partition: _Optional[int] = ...) -> None: ...

class ConfigureQueue(_message.Message):
    __slots__ = ("request_id", "queue_id", "options")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    options: QueueOptions
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., options: _Optional[_Union[QueueOptions, _Mapping]] = ...) -> None: ...

class ConfigureQueueResponse(_message.Message):
    __slots__ = ("request_id", "queue_id", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    status: Status
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class CloseQueue(_message.Message):
    __slots__ = ("request_id", "queue_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ...) -> None: ...

class CloseQueueResponse(_message.Message):
    __slots__ = ("request_id", "queue_id", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    status: Status
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class Property(_message.Message):
    __slots__ = ("name", "bool_value", "int32_value", "int64_value", "string_value", "binary_value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT32_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT64_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BINARY_VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    bool_value: bool
    int32_value: int
    int64_value: int
    string_value: str
    binary_value: bytes
    def __init__(self, name: _Optional[str] = ..., bool_value: _Optional[bool] = ..., int32_value: _Optional[int] = ..., int64_value: _Optional[int] = ..., string_value: _Optional[str] = ..., binary_value: _Optional[bytes] = ...) -> None: ...

class PutMessage(_message.Message):
    __slots__ = ("queue_id", "guid", "payload", "properties", "put_time_us", "compression")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PUT_TIME_US_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    guid: bytes
    payload: bytes
    properties: _containers.RepeatedCompositeFieldContainer[Property]
    put_time_us: int
    compression: Compression
    def __init__(self, queue_id: _Optional[int] = ..., guid: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Iterable[_Union[Property, _Mapping]]] = ..., put_time_us: _Optional[int] = ..., compression: _Optional[_Union[Compression, str]] = ...) -> None: ...

class PutBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PutMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[PutMessage, _Mapping]]] = ...) -> None: ...

class PutColumns(_message.Message):
    __slots__ = ("queue_id", "arrow_ipc", "per_message", "guids", "queue_ids")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    arrow_ipc: bytes
    per_message: bool
    guids: bytes
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_id: _Optional[int] = ..., arrow_ipc: _Optional[bytes] = ..., per_message: _Optional[bool] = ..., guids: _Optional[bytes] = ..., queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PushColumns(_message.Message):
    __slots__ = ("queue_id", "count", "arrow_ipc", "queue_ids", "seq_starts", "seq_counts", "range_queue_ids")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_STARTS_FIELD_NUMBER: _ClassVar[int]
    SEQ_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RANGE_QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    count: int
    arrow_ipc: bytes
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    seq_starts: _containers.RepeatedScalarFieldContainer[int]
    seq_counts: _containers.RepeatedScalarFieldContainer[int]
    range_queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_id: _Optional[int] = ..., count: _Optional[int] = ..., arrow_ipc: _Optional[bytes] = ..., queue_ids: _Optional[_Iterable[int]] = ..., seq_starts: _Optional[_Iterable[int]] = ..., seq_counts: _Optional[_Iterable[int]] = ..., range_queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AckColumns(_message.Message):
    __slots__ = ("queue_id", "guids", "code", "message", "refused_rows", "refused_codes", "refused_messages")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_ROWS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_CODES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    guids: bytes
    code: ResultCode
    message: str
    refused_rows: _containers.RepeatedScalarFieldContainer[int]
    refused_codes: _containers.RepeatedScalarFieldContainer[ResultCode]
    refused_messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queue_id: _Optional[int] = ..., guids: _Optional[bytes] = ..., code: _Optional[_Union[ResultCode, str]] = ..., message: _Optional[str] = ..., refused_rows: _Optional[_Iterable[int]] = ..., refused_codes: _Optional[_Iterable[_Union[ResultCode, str]]] = ..., refused_messages: _Optional[_Iterable[str]] = ...) -> None: ...

class AckMessage(_message.Message):
    __slots__ = ("queue_id", "guid", "code", "message")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    guid: bytes
    code: ResultCode
    message: str
    def __init__(self, queue_id: _Optional[int] = ..., guid: _Optional[bytes] = ..., code: _Optional[_Union[ResultCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AckBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[AckMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[AckMessage, _Mapping]]] = ...) -> None: ...

class PushMessage(_message.Message):
    __slots__ = ("queue_id", "guid", "payload", "properties", "put_time_us", "delivery_count", "sequence", "compression", "queue_ids")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PUT_TIME_US_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    guid: bytes
    payload: bytes
    properties: _containers.RepeatedCompositeFieldContainer[Property]
    put_time_us: int
    delivery_count: int
    sequence: int
    compression: Compression
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_id: _Optional[int] = ..., guid: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Iterable[_Union[Property, _Mapping]]] = ..., put_time_us: _Optional[int] = ..., delivery_count: _Optional[int] = ..., sequence: _Optional[int] = ..., compression: _Optional[_Union[Compression, str]] = ..., queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PushBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PushMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[PushMessage, _Mapping]]] = ...) -> None: ...

class ConfirmMessage(_message.Message):
    __slots__ = ("queue_id", "guid", "sequence")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    guid: bytes
    sequence: int
    def __init__(self, queue_id: _Optional[int] = ..., guid: _Optional[bytes] = ..., sequence: _Optional[int] = ...) -> None: ...

class ConfirmBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ConfirmMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ConfirmMessage, _Mapping]]] = ...) -> None: ...

class ConfirmColumns(_message.Message):
    __slots__ = ("queue_id", "starts", "counts", "queue_ids")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    starts: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_id: _Optional[int] = ..., starts: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("request_id", "timeout_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    timeout_ms: int
    def __init__(self, request_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_time_us",)
    SENT_TIME_US_FIELD_NUMBER: _ClassVar[int]
    sent_time_us: int
    def __init__(self, sent_time_us: _Optional[int] = ...) -> None: ...

class FrameError(_message.Message):
    __slots__ = ("request_id", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: Status
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("open_queue", "open_queue_response", "configure_queue", "configure_queue_response", "close_queue", "close_queue_response", "put", "ack", "push", "confirm", "stop_request", "stop_response", "heartbeat", "error", "put_columns", "ack_columns", "push_columns", "confirm_columns", "bundle")
    OPEN_QUEUE_FIELD_NUMBER: _ClassVar[int]
    OPEN_QUEUE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_QUEUE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_QUEUE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STOP_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PUT_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ACK_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PUSH_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    open_queue: OpenQueue
    open_queue_response: OpenQueueResponse
    configure_queue: ConfigureQueue
    configure_queue_response: ConfigureQueueResponse
    close_queue: CloseQueue
    close_queue_response: CloseQueueResponse
    put: PutBatch
    ack: AckBatch
    push: PushBatch
    confirm: ConfirmBatch
    stop_request: StopRequest
    stop_response: StopResponse
    heartbeat: Heartbeat
    error: FrameError
    put_columns: PutColumns
    ack_columns: AckColumns
    push_columns: PushColumns
    confirm_columns: ConfirmColumns
    bundle: FrameBundle
    def __init__(self, open_queue: _Optional[_Union[OpenQueue, _Mapping]] = ..., open_queue_response: _Optional[_Union[OpenQueueResponse, _Mapping]] = ..., configure_queue: _Optional[_Union[ConfigureQueue, _Mapping]] = ..., configure_queue_response: _Optional[_Union[ConfigureQueueResponse, _Mapping]] = ..., close_queue: _Optional[_Union[CloseQueue, _Mapping]] = ..., close_queue_response: _Optional[_Union[CloseQueueResponse, _Mapping]] = ..., put: _Optional[_Union[PutBatch, _Mapping]] = ..., ack: _Optional[_Union[AckBatch, _Mapping]] = ..., push: _Optional[_Union[PushBatch, _Mapping]] = ..., confirm: _Optional[_Union[ConfirmBatch, _Mapping]] = ..., stop_request: _Optional[_Union[StopRequest, _Mapping]] = ..., stop_response: _Optional[_Union[StopResponse, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., error: _Optional[_Union[FrameError, _Mapping]] = ..., put_columns: _Optional[_Union[PutColumns, _Mapping]] = ..., ack_columns: _Optional[_Union[AckColumns, _Mapping]] = ..., push_columns: _Optional[_Union[PushColumns, _Mapping]] = ..., confirm_columns: _Optional[_Union[ConfirmColumns, _Mapping]] = ..., bundle: _Optional[_Union[FrameBundle, _Mapping]] = ...) -> None: ...

class FrameBundle(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...

class DeliveryNotice(_message.Message):
    __slots__ = ("partition", "delivery_version")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_VERSION_FIELD_NUMBER: _ClassVar[int]
    partition: int
    delivery_version: int
    def __init__(self, partition: _Optional[int] = ..., delivery_version: _Optional[int] = ...) -> None: ...

class NoticeAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdminRequest(_message.Message):
    __slots__ = ("command", "domain", "uri", "app")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    command: str
    domain: str
    uri: str
    app: str
    def __init__(self, command: _Optional[str] = ..., domain: _Optional[str] = ..., uri: _Optional[str] = ..., app: _Optional[str] = ...) -> None: ...

class AdminReply(_message.Message):
    __slots__ = ("code", "message", "json")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    code: ResultCode
    message: str
    json: str
    def __init__(self, code: _Optional[_Union[ResultCode, str]] = ..., message: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...
