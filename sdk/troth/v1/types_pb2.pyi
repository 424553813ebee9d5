import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromiseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROMISE_STATE_UNSPECIFIED: _ClassVar[PromiseState]
    PROMISE_STATE_PENDING: _ClassVar[PromiseState]
    PROMISE_STATE_RESOLVED: _ClassVar[PromiseState]
    PROMISE_STATE_REJECTED: _ClassVar[PromiseState]
    PROMISE_STATE_REJECTED_CANCELED: _ClassVar[PromiseState]
    PROMISE_STATE_REJECTED_TIMEDOUT: _ClassVar[PromiseState]
PROMISE_STATE_UNSPECIFIED: PromiseState
PROMISE_STATE_PENDING: PromiseState
PROMISE_STATE_RESOLVED: PromiseState
PROMISE_STATE_REJECTED: PromiseState
PROMISE_STATE_REJECTED_CANCELED: PromiseState
PROMISE_STATE_REJECTED_TIMEDOUT: PromiseState

class Payload(_message.Message):
    __slots__ = ("headers", "data", "json")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.ScalarMap[str, str]
    data: bytes
    json: _struct_pb2.Value
    def __init__(self, headers: _Optional[_Mapping[str, str]] = ..., data: _Optional[bytes] = ..., json: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class Promise(_message.Message):
    __slots__ = ("id", "state", "param", "value", "tags", "create_time", "settle_time", "expire_time", "idempotency_key_for_create", "idempotency_key_for_settle", "settled_by", "schema", "title", "message", "requested_by", "workflow_version", "root_id", "parent_id", "approvers", "started_by")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FOR_CREATE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FOR_SETTLE_FIELD_NUMBER: _ClassVar[int]
    SETTLED_BY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROOT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: PromiseState
    param: Payload
    value: Payload
    tags: _containers.ScalarMap[str, str]
    create_time: _timestamp_pb2.Timestamp
    settle_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    idempotency_key_for_create: str
    idempotency_key_for_settle: str
    settled_by: str
    schema: str
    title: str
    message: str
    requested_by: str
    workflow_version: str
    root_id: str
    parent_id: str
    approvers: Approvers
    started_by: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[PromiseState, str]] = ..., param: _Optional[_Union[Payload, _Mapping]] = ..., value: _Optional[_Union[Payload, _Mapping]] = ..., tags: _Optional[_Mapping[str, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., settle_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key_for_create: _Optional[str] = ..., idempotency_key_for_settle: _Optional[str] = ..., settled_by: _Optional[str] = ..., schema: _Optional[str] = ..., title: _Optional[str] = ..., message: _Optional[str] = ..., requested_by: _Optional[str] = ..., workflow_version: _Optional[str] = ..., root_id: _Optional[str] = ..., parent_id: _Optional[str] = ..., approvers: _Optional[_Union[Approvers, _Mapping]] = ..., started_by: _Optional[str] = ...) -> None: ...

class Approvers(_message.Message):
    __slots__ = ("principals", "roles", "not_requester", "distinct", "quorum", "permissions")
    PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    NOT_REQUESTER_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    principals: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    not_requester: bool
    distinct: bool
    quorum: str
    permissions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, principals: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., not_requester: _Optional[bool] = ..., distinct: _Optional[bool] = ..., quorum: _Optional[str] = ..., permissions: _Optional[_Iterable[str]] = ...) -> None: ...

class Principal(_message.Message):
    __slots__ = ("name", "roles", "groups", "prefixes", "permissions", "authenticated")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    groups: _containers.RepeatedScalarFieldContainer[str]
    prefixes: _containers.RepeatedScalarFieldContainer[str]
    permissions: _containers.RepeatedScalarFieldContainer[str]
    authenticated: bool
    def __init__(self, name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., groups: _Optional[_Iterable[str]] = ..., prefixes: _Optional[_Iterable[str]] = ..., permissions: _Optional[_Iterable[str]] = ..., authenticated: _Optional[bool] = ...) -> None: ...

class TaskFence(_message.Message):
    __slots__ = ("task_id", "counter", "worker_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    counter: int
    worker_id: str
    def __init__(self, task_id: _Optional[str] = ..., counter: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...
