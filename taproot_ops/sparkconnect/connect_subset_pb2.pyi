from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UserContext(_message.Message):
    __slots__ = ("user_id", "user_name")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    USER_NAME_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    user_name: str
    def __init__(self, user_id: _Optional[str] = ..., user_name: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("root",)
    ROOT_FIELD_NUMBER: _ClassVar[int]
    root: Relation
    def __init__(self, root: _Optional[_Union[Relation, _Mapping]] = ...) -> None: ...

class Relation(_message.Message):
    __slots__ = ("project", "limit", "sql", "show_string")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    SHOW_STRING_FIELD_NUMBER: _ClassVar[int]
    project: Project
    limit: Limit
    sql: SQL
    show_string: ShowString
    def __init__(self, project: _Optional[_Union[Project, _Mapping]] = ..., limit: _Optional[_Union[Limit, _Mapping]] = ..., sql: _Optional[_Union[SQL, _Mapping]] = ..., show_string: _Optional[_Union[ShowString, _Mapping]] = ...) -> None: ...

class SQL(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class Limit(_message.Message):
    __slots__ = ("input", "limit")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    input: Relation
    limit: int
    def __init__(self, input: _Optional[_Union[Relation, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class Project(_message.Message):
    __slots__ = ("input", "expressions")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    EXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    input: Relation
    expressions: _containers.RepeatedCompositeFieldContainer[Expression]
    def __init__(self, input: _Optional[_Union[Relation, _Mapping]] = ..., expressions: _Optional[_Iterable[_Union[Expression, _Mapping]]] = ...) -> None: ...

class ShowString(_message.Message):
    __slots__ = ("input", "num_rows", "truncate", "vertical")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    VERTICAL_FIELD_NUMBER: _ClassVar[int]
    input: Relation
    num_rows: int
    truncate: int
    vertical: bool
    def __init__(self, input: _Optional[_Union[Relation, _Mapping]] = ..., num_rows: _Optional[int] = ..., truncate: _Optional[int] = ..., vertical: _Optional[bool] = ...) -> None: ...

class Expression(_message.Message):
    __slots__ = ("unresolved_function", "unresolved_star")
    class UnresolvedFunction(_message.Message):
        __slots__ = ("function_name", "arguments")
        FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
        ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
        function_name: str
        arguments: _containers.RepeatedCompositeFieldContainer[Expression]
        def __init__(self, function_name: _Optional[str] = ..., arguments: _Optional[_Iterable[_Union[Expression, _Mapping]]] = ...) -> None: ...
    class UnresolvedStar(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    UNRESOLVED_FUNCTION_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_STAR_FIELD_NUMBER: _ClassVar[int]
    unresolved_function: Expression.UnresolvedFunction
    unresolved_star: Expression.UnresolvedStar
    def __init__(self, unresolved_function: _Optional[_Union[Expression.UnresolvedFunction, _Mapping]] = ..., unresolved_star: _Optional[_Union[Expression.UnresolvedStar, _Mapping]] = ...) -> None: ...

class ExecutePlanRequest(_message.Message):
    __slots__ = ("session_id", "user_context", "plan", "client_type", "operation_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    user_context: UserContext
    plan: Plan
    client_type: str
    operation_id: str
    def __init__(self, session_id: _Optional[str] = ..., user_context: _Optional[_Union[UserContext, _Mapping]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., client_type: _Optional[str] = ..., operation_id: _Optional[str] = ...) -> None: ...

class ExecutePlanResponse(_message.Message):
    __slots__ = ("session_id", "operation_id", "arrow_batch", "result_complete")
    class ArrowBatch(_message.Message):
        __slots__ = ("row_count", "data")
        ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
        DATA_FIELD_NUMBER: _ClassVar[int]
        row_count: int
        data: bytes
        def __init__(self, row_count: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
    class ResultComplete(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_BATCH_FIELD_NUMBER: _ClassVar[int]
    RESULT_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    operation_id: str
    arrow_batch: ExecutePlanResponse.ArrowBatch
    result_complete: ExecutePlanResponse.ResultComplete
    def __init__(self, session_id: _Optional[str] = ..., operation_id: _Optional[str] = ..., arrow_batch: _Optional[_Union[ExecutePlanResponse.ArrowBatch, _Mapping]] = ..., result_complete: _Optional[_Union[ExecutePlanResponse.ResultComplete, _Mapping]] = ...) -> None: ...

class ReleaseSessionRequest(_message.Message):
    __slots__ = ("session_id", "user_context", "client_type")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    user_context: UserContext
    client_type: str
    def __init__(self, session_id: _Optional[str] = ..., user_context: _Optional[_Union[UserContext, _Mapping]] = ..., client_type: _Optional[str] = ...) -> None: ...

class ReleaseSessionResponse(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...
