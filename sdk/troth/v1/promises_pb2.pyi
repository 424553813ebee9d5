import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from troth.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromiseOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROMISE_ORDER_UNSPECIFIED: _ClassVar[PromiseOrder]
    PROMISE_ORDER_CREATED_ASC: _ClassVar[PromiseOrder]
    PROMISE_ORDER_CREATED_DESC: _ClassVar[PromiseOrder]
    PROMISE_ORDER_EXPIRE_TIME_ASC: _ClassVar[PromiseOrder]

class PromiseEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROMISE_EVENT_TYPE_UNSPECIFIED: _ClassVar[PromiseEventType]
    PROMISE_EVENT_TYPE_CREATED: _ClassVar[PromiseEventType]
    PROMISE_EVENT_TYPE_SETTLED: _ClassVar[PromiseEventType]
    PROMISE_EVENT_TYPE_TIMED_OUT: _ClassVar[PromiseEventType]
PROMISE_ORDER_UNSPECIFIED: PromiseOrder
PROMISE_ORDER_CREATED_ASC: PromiseOrder
PROMISE_ORDER_CREATED_DESC: PromiseOrder
PROMISE_ORDER_EXPIRE_TIME_ASC: PromiseOrder
PROMISE_EVENT_TYPE_UNSPECIFIED: PromiseEventType
PROMISE_EVENT_TYPE_CREATED: PromiseEventType
PROMISE_EVENT_TYPE_SETTLED: PromiseEventType
PROMISE_EVENT_TYPE_TIMED_OUT: PromiseEventType

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("principal",)
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    principal: _types_pb2.Principal
    def __init__(self, principal: _Optional[_Union[_types_pb2.Principal, _Mapping]] = ...) -> None: ...

class MintSettleTokenRequest(_message.Message):
    __slots__ = ("promise_id", "outcomes", "ttl", "fence", "acts_for")
    PROMISE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ACTS_FOR_FIELD_NUMBER: _ClassVar[int]
    promise_id: str
    outcomes: _containers.RepeatedScalarFieldContainer[_types_pb2.PromiseState]
    ttl: _duration_pb2.Duration
    fence: _types_pb2.TaskFence
    acts_for: str
    def __init__(self, promise_id: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[_types_pb2.PromiseState, str]]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fence: _Optional[_Union[_types_pb2.TaskFence, _Mapping]] = ..., acts_for: _Optional[str] = ...) -> None: ...

class MintSettleTokenResponse(_message.Message):
    __slots__ = ("token", "expire_time", "key_id", "token_id", "acts_for")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    ACTS_FOR_FIELD_NUMBER: _ClassVar[int]
    token: str
    expire_time: _timestamp_pb2.Timestamp
    key_id: str
    token_id: str
    acts_for: str
    def __init__(self, token: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., key_id: _Optional[str] = ..., token_id: _Optional[str] = ..., acts_for: _Optional[str] = ...) -> None: ...

class CreatePromiseRequest(_message.Message):
    __slots__ = ("id", "param", "tags", "expire_time", "ttl", "never_expires", "idempotency_key", "strict", "resolved_with", "rejected_with", "schema", "title", "message", "requested_by", "fence", "approvers", "state", "wait")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    NEVER_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_WITH_FIELD_NUMBER: _ClassVar[int]
    REJECTED_WITH_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    id: str
    param: _types_pb2.Payload
    tags: _containers.ScalarMap[str, str]
    expire_time: _timestamp_pb2.Timestamp
    ttl: _duration_pb2.Duration
    never_expires: bool
    idempotency_key: str
    strict: bool
    resolved_with: _types_pb2.Payload
    rejected_with: _types_pb2.Payload
    schema: str
    title: str
    message: str
    requested_by: str
    fence: _types_pb2.TaskFence
    approvers: _types_pb2.Approvers
    state: WorkflowStateStep
    wait: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., param: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., tags: _Optional[_Mapping[str, str]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., never_expires: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., strict: _Optional[bool] = ..., resolved_with: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., rejected_with: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., schema: _Optional[str] = ..., title: _Optional[str] = ..., message: _Optional[str] = ..., requested_by: _Optional[str] = ..., fence: _Optional[_Union[_types_pb2.TaskFence, _Mapping]] = ..., approvers: _Optional[_Union[_types_pb2.Approvers, _Mapping]] = ..., state: _Optional[_Union[WorkflowStateStep, _Mapping]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WorkflowStateStep(_message.Message):
    __slots__ = ("name", "write")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    name: str
    write: bool
    def __init__(self, name: _Optional[str] = ..., write: _Optional[bool] = ...) -> None: ...

class CreatePromiseResponse(_message.Message):
    __slots__ = ("promise", "created")
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    created: bool
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetPromiseRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetPromiseResponse(_message.Message):
    __slots__ = ("promise",)
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ...) -> None: ...

class SearchPromisesRequest(_message.Message):
    __slots__ = ("id", "states", "tags", "page_size", "page_token", "order", "created_before", "mine", "parent_id")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MINE_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.PromiseState]
    tags: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    order: PromiseOrder
    created_before: _timestamp_pb2.Timestamp
    mine: bool
    parent_id: str
    def __init__(self, id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.PromiseState, str]]] = ..., tags: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., order: _Optional[_Union[PromiseOrder, str]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mine: _Optional[bool] = ..., parent_id: _Optional[str] = ...) -> None: ...

class SearchPromisesResponse(_message.Message):
    __slots__ = ("promises", "next_page_token")
    PROMISES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    promises: _containers.RepeatedCompositeFieldContainer[_types_pb2.Promise]
    next_page_token: str
    def __init__(self, promises: _Optional[_Iterable[_Union[_types_pb2.Promise, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResolvePromiseRequest(_message.Message):
    __slots__ = ("id", "value", "idempotency_key", "strict", "create_if_missing", "fence", "settle_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    CREATE_IF_MISSING_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    value: _types_pb2.Payload
    idempotency_key: str
    strict: bool
    create_if_missing: bool
    fence: _types_pb2.TaskFence
    settle_token: str
    def __init__(self, id: _Optional[str] = ..., value: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., strict: _Optional[bool] = ..., create_if_missing: _Optional[bool] = ..., fence: _Optional[_Union[_types_pb2.TaskFence, _Mapping]] = ..., settle_token: _Optional[str] = ...) -> None: ...

class RejectPromiseRequest(_message.Message):
    __slots__ = ("id", "value", "idempotency_key", "strict", "create_if_missing", "fence", "settle_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    CREATE_IF_MISSING_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    value: _types_pb2.Payload
    idempotency_key: str
    strict: bool
    create_if_missing: bool
    fence: _types_pb2.TaskFence
    settle_token: str
    def __init__(self, id: _Optional[str] = ..., value: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., strict: _Optional[bool] = ..., create_if_missing: _Optional[bool] = ..., fence: _Optional[_Union[_types_pb2.TaskFence, _Mapping]] = ..., settle_token: _Optional[str] = ...) -> None: ...

class CancelPromiseRequest(_message.Message):
    __slots__ = ("id", "value", "idempotency_key", "strict")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    id: str
    value: _types_pb2.Payload
    idempotency_key: str
    strict: bool
    def __init__(self, id: _Optional[str] = ..., value: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class ResolvePromiseResponse(_message.Message):
    __slots__ = ("promise", "applied", "workflow_waiting")
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_WAITING_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    applied: bool
    workflow_waiting: str
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., applied: _Optional[bool] = ..., workflow_waiting: _Optional[str] = ...) -> None: ...

class RejectPromiseResponse(_message.Message):
    __slots__ = ("promise", "applied", "workflow_waiting")
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_WAITING_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    applied: bool
    workflow_waiting: str
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., applied: _Optional[bool] = ..., workflow_waiting: _Optional[str] = ...) -> None: ...

class CancelPromiseResponse(_message.Message):
    __slots__ = ("promise", "applied")
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    applied: bool
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., applied: _Optional[bool] = ...) -> None: ...

class WatchPromiseRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WatchPromiseResponse(_message.Message):
    __slots__ = ("promise",)
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ...) -> None: ...

class WaitPromiseRequest(_message.Message):
    __slots__ = ("id", "wait")
    ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    id: str
    wait: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitPromiseResponse(_message.Message):
    __slots__ = ("promise",)
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    promise: _types_pb2.Promise
    def __init__(self, promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ...) -> None: ...

class WatchPromisesRequest(_message.Message):
    __slots__ = ("id", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    tags: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WatchPromisesResponse(_message.Message):
    __slots__ = ("type", "promise")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    type: PromiseEventType
    promise: _types_pb2.Promise
    def __init__(self, type: _Optional[_Union[PromiseEventType, str]] = ..., promise: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ...) -> None: ...

class PrunePromisesRequest(_message.Message):
    __slots__ = ("older_than", "dry_run")
    OLDER_THAN_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    older_than: _duration_pb2.Duration
    dry_run: bool
    def __init__(self, older_than: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PrunePromisesResponse(_message.Message):
    __slots__ = ("pruned", "workflows", "standalone", "dry_run")
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    STANDALONE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    pruned: int
    workflows: int
    standalone: int
    dry_run: bool
    def __init__(self, pruned: _Optional[int] = ..., workflows: _Optional[int] = ..., standalone: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...
