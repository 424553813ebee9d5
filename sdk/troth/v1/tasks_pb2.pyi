import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from troth.v1 import promises_pb2 as _promises_pb2
from troth.v1 import schedules_pb2 as _schedules_pb2
from troth.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_UNSPECIFIED: _ClassVar[TaskKind]
    TASK_KIND_INVOKE: _ClassVar[TaskKind]
    TASK_KIND_RESUME: _ClassVar[TaskKind]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_PENDING: _ClassVar[TaskState]
    TASK_STATE_CLAIMED: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]

class StateLostTo(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_LOST_TO_UNSPECIFIED: _ClassVar[StateLostTo]
    STATE_LOST_TO_TASK_CLAIMED: _ClassVar[StateLostTo]
    STATE_LOST_TO_VERSION_CHANGED: _ClassVar[StateLostTo]
    STATE_LOST_TO_RUN_ENDED: _ClassVar[StateLostTo]
TASK_KIND_UNSPECIFIED: TaskKind
TASK_KIND_INVOKE: TaskKind
TASK_KIND_RESUME: TaskKind
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_PENDING: TaskState
TASK_STATE_CLAIMED: TaskState
TASK_STATE_COMPLETED: TaskState
STATE_LOST_TO_UNSPECIFIED: StateLostTo
STATE_LOST_TO_TASK_CLAIMED: StateLostTo
STATE_LOST_TO_VERSION_CHANGED: StateLostTo
STATE_LOST_TO_RUN_ENDED: StateLostTo

class CallsRequest(_message.Message):
    __slots__ = ("id", "method", "request", "more", "traceparent")
    ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    id: int
    method: str
    request: bytes
    more: _containers.RepeatedCompositeFieldContainer[CallsRequest]
    traceparent: str
    def __init__(self, id: _Optional[int] = ..., method: _Optional[str] = ..., request: _Optional[bytes] = ..., more: _Optional[_Iterable[_Union[CallsRequest, _Mapping]]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class CallsResponse(_message.Message):
    __slots__ = ("id", "code", "response", "message", "status_details", "more")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    id: int
    code: int
    response: bytes
    message: str
    status_details: bytes
    more: _containers.RepeatedCompositeFieldContainer[CallsResponse]
    def __init__(self, id: _Optional[int] = ..., code: _Optional[int] = ..., response: _Optional[bytes] = ..., message: _Optional[str] = ..., status_details: _Optional[bytes] = ..., more: _Optional[_Iterable[_Union[CallsResponse, _Mapping]]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "root_promise_id", "group", "kind", "state", "counter", "worker_id", "lease_expire_time", "workflow", "workflow_version", "create_time", "waiting_for", "worker_principal", "failed_attempts", "last_error", "last_traceback", "next_attempt_time", "version_absent_since")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_PROMISE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    WORKER_PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    FAILED_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    VERSION_ABSENT_SINCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    root_promise_id: str
    group: str
    kind: TaskKind
    state: TaskState
    counter: int
    worker_id: str
    lease_expire_time: _timestamp_pb2.Timestamp
    workflow: str
    workflow_version: str
    create_time: _timestamp_pb2.Timestamp
    waiting_for: str
    worker_principal: str
    failed_attempts: int
    last_error: str
    last_traceback: str
    next_attempt_time: _timestamp_pb2.Timestamp
    version_absent_since: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., root_promise_id: _Optional[str] = ..., group: _Optional[str] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., state: _Optional[_Union[TaskState, str]] = ..., counter: _Optional[int] = ..., worker_id: _Optional[str] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workflow: _Optional[str] = ..., workflow_version: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., waiting_for: _Optional[str] = ..., worker_principal: _Optional[str] = ..., failed_attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., last_traceback: _Optional[str] = ..., next_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., version_absent_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkflowVersion(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class PollRequest(_message.Message):
    __slots__ = ("group", "worker_id", "capacity", "lease", "workflows")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    group: str
    worker_id: str
    capacity: int
    lease: _duration_pb2.Duration
    workflows: _containers.RepeatedCompositeFieldContainer[WorkflowVersion]
    def __init__(self, group: _Optional[str] = ..., worker_id: _Optional[str] = ..., capacity: _Optional[int] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., workflows: _Optional[_Iterable[_Union[WorkflowVersion, _Mapping]]] = ...) -> None: ...

class PollResponse(_message.Message):
    __slots__ = ("task", "root", "history", "more")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    task: Task
    root: _types_pb2.Promise
    history: _containers.RepeatedCompositeFieldContainer[_types_pb2.Promise]
    more: _containers.RepeatedCompositeFieldContainer[PollResponse]
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., root: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., history: _Optional[_Iterable[_Union[_types_pb2.Promise, _Mapping]]] = ..., more: _Optional[_Iterable[_Union[PollResponse, _Mapping]]] = ...) -> None: ...

class CompleteTaskRequest(_message.Message):
    __slots__ = ("task_id", "counter", "worker_id", "resolve_root", "reject_root", "suspend_on", "record_step")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLVE_ROOT_FIELD_NUMBER: _ClassVar[int]
    REJECT_ROOT_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_ON_FIELD_NUMBER: _ClassVar[int]
    RECORD_STEP_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    counter: int
    worker_id: str
    resolve_root: _types_pb2.Payload
    reject_root: _types_pb2.Payload
    suspend_on: _containers.RepeatedScalarFieldContainer[str]
    record_step: _promises_pb2.CreatePromiseRequest
    def __init__(self, task_id: _Optional[str] = ..., counter: _Optional[int] = ..., worker_id: _Optional[str] = ..., resolve_root: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., reject_root: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., suspend_on: _Optional[_Iterable[str]] = ..., record_step: _Optional[_Union[_promises_pb2.CreatePromiseRequest, _Mapping]] = ...) -> None: ...

class CompleteTaskResponse(_message.Message):
    __slots__ = ("task", "root", "settled", "recorded_step")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_STEP_FIELD_NUMBER: _ClassVar[int]
    task: Task
    root: _types_pb2.Promise
    settled: _containers.RepeatedCompositeFieldContainer[_types_pb2.Promise]
    recorded_step: _types_pb2.Promise
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., root: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., settled: _Optional[_Iterable[_Union[_types_pb2.Promise, _Mapping]]] = ..., recorded_step: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "lease", "group")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease: _duration_pb2.Duration
    group: str
    def __init__(self, worker_id: _Optional[str] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., group: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("task_ids", "counters", "server_time")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    counters: _containers.ScalarMap[str, int]
    server_time: _timestamp_pb2.Timestamp
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., counters: _Optional[_Mapping[str, int]] = ..., server_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReleaseTaskRequest(_message.Message):
    __slots__ = ("task_id", "counter", "worker_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    counter: int
    worker_id: str
    def __init__(self, task_id: _Optional[str] = ..., counter: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class ReleaseTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class RegisterCallbacksRequest(_message.Message):
    __slots__ = ("task_id", "counter", "worker_id", "promise_ids")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMISE_IDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    counter: int
    worker_id: str
    promise_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_id: _Optional[str] = ..., counter: _Optional[int] = ..., worker_id: _Optional[str] = ..., promise_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterCallbacksResponse(_message.Message):
    __slots__ = ("settled",)
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    settled: _containers.RepeatedCompositeFieldContainer[_types_pb2.Promise]
    def __init__(self, settled: _Optional[_Iterable[_Union[_types_pb2.Promise, _Mapping]]] = ...) -> None: ...

class SearchTasksRequest(_message.Message):
    __slots__ = ("group", "page_size", "root_promise_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROOT_PROMISE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    page_size: int
    root_promise_id: str
    def __init__(self, group: _Optional[str] = ..., page_size: _Optional[int] = ..., root_promise_id: _Optional[str] = ...) -> None: ...

class SearchTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class FailTaskRequest(_message.Message):
    __slots__ = ("task_id", "counter", "worker_id", "error", "traceback")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    counter: int
    worker_id: str
    error: str
    traceback: str
    def __init__(self, task_id: _Optional[str] = ..., counter: _Optional[int] = ..., worker_id: _Optional[str] = ..., error: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class FailTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class FailWorkflowRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FailWorkflowResponse(_message.Message):
    __slots__ = ("root",)
    ROOT_FIELD_NUMBER: _ClassVar[int]
    root: _types_pb2.Promise
    def __init__(self, root: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ...) -> None: ...

class MoveWorkflowRequest(_message.Message):
    __slots__ = ("id", "to_version", "to_current")
    ID_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_CURRENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    to_version: str
    to_current: bool
    def __init__(self, id: _Optional[str] = ..., to_version: _Optional[str] = ..., to_current: _Optional[bool] = ...) -> None: ...

class MoveWorkflowResponse(_message.Message):
    __slots__ = ("root", "task")
    ROOT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    root: _types_pb2.Promise
    task: Task
    def __init__(self, root: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class SearchWorkflowsRequest(_message.Message):
    __slots__ = ("id", "states", "group", "workflow", "workflow_version", "paused", "waiting_for_human", "created_after", "created_before", "page_size", "page_token", "order")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_HUMAN_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    id: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.PromiseState]
    group: str
    workflow: str
    workflow_version: str
    paused: bool
    waiting_for_human: bool
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    order: _promises_pb2.PromiseOrder
    def __init__(self, id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.PromiseState, str]]] = ..., group: _Optional[str] = ..., workflow: _Optional[str] = ..., workflow_version: _Optional[str] = ..., paused: _Optional[bool] = ..., waiting_for_human: _Optional[bool] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., order: _Optional[_Union[_promises_pb2.PromiseOrder, str]] = ...) -> None: ...

class WorkflowSummary(_message.Message):
    __slots__ = ("root", "group", "workflow", "workflow_version", "task", "waiting_on")
    ROOT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    WAITING_ON_FIELD_NUMBER: _ClassVar[int]
    root: _types_pb2.Promise
    group: str
    workflow: str
    workflow_version: str
    task: Task
    waiting_on: _containers.RepeatedCompositeFieldContainer[_types_pb2.Promise]
    def __init__(self, root: _Optional[_Union[_types_pb2.Promise, _Mapping]] = ..., group: _Optional[str] = ..., workflow: _Optional[str] = ..., workflow_version: _Optional[str] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., waiting_on: _Optional[_Iterable[_Union[_types_pb2.Promise, _Mapping]]] = ...) -> None: ...

class SearchWorkflowsResponse(_message.Message):
    __slots__ = ("workflows", "next_page_token")
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[WorkflowSummary]
    next_page_token: str
    def __init__(self, workflows: _Optional[_Iterable[_Union[WorkflowSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RetryWorkflowNowRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RetryWorkflowNowResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class SearchWorkersRequest(_message.Message):
    __slots__ = ("group", "page_size", "page_token")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    group: str
    page_size: int
    page_token: str
    def __init__(self, group: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SearchWorkersResponse(_message.Message):
    __slots__ = ("workers", "next_page_token")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[Worker]
    next_page_token: str
    def __init__(self, workers: _Optional[_Iterable[_Union[Worker, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("worker_id", "group", "principal", "workflows", "capacity", "task_ids", "connect_time", "last_heartbeat_time", "streams", "stalled")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    CONNECT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    STALLED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    group: str
    principal: str
    workflows: _containers.RepeatedCompositeFieldContainer[WorkflowVersion]
    capacity: int
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    connect_time: _timestamp_pb2.Timestamp
    last_heartbeat_time: _timestamp_pb2.Timestamp
    streams: int
    stalled: bool
    def __init__(self, worker_id: _Optional[str] = ..., group: _Optional[str] = ..., principal: _Optional[str] = ..., workflows: _Optional[_Iterable[_Union[WorkflowVersion, _Mapping]]] = ..., capacity: _Optional[int] = ..., task_ids: _Optional[_Iterable[str]] = ..., connect_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., streams: _Optional[int] = ..., stalled: _Optional[bool] = ...) -> None: ...

class WorkflowState(_message.Message):
    __slots__ = ("workflow_id", "name", "version", "value", "update_time", "updated_by")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    name: str
    version: int
    value: _types_pb2.Payload
    update_time: _timestamp_pb2.Timestamp
    updated_by: str
    def __init__(self, workflow_id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., value: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_by: _Optional[str] = ...) -> None: ...

class GetWorkflowStateRequest(_message.Message):
    __slots__ = ("workflow_id", "name", "require_parked")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_PARKED_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    name: str
    require_parked: bool
    def __init__(self, workflow_id: _Optional[str] = ..., name: _Optional[str] = ..., require_parked: _Optional[bool] = ...) -> None: ...

class GetWorkflowStateResponse(_message.Message):
    __slots__ = ("state", "parked", "not_parked_because")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    NOT_PARKED_BECAUSE_FIELD_NUMBER: _ClassVar[int]
    state: WorkflowState
    parked: bool
    not_parked_because: str
    def __init__(self, state: _Optional[_Union[WorkflowState, _Mapping]] = ..., parked: _Optional[bool] = ..., not_parked_because: _Optional[str] = ...) -> None: ...

class ReplaceWorkflowStateRequest(_message.Message):
    __slots__ = ("workflow_id", "name", "value", "expected_version")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    name: str
    value: _types_pb2.Payload
    expected_version: int
    def __init__(self, workflow_id: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[_Union[_types_pb2.Payload, _Mapping]] = ..., expected_version: _Optional[int] = ...) -> None: ...

class ReplaceWorkflowStateResponse(_message.Message):
    __slots__ = ("won", "state", "lost_to", "message")
    WON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOST_TO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    won: bool
    state: WorkflowState
    lost_to: StateLostTo
    message: str
    def __init__(self, won: _Optional[bool] = ..., state: _Optional[_Union[WorkflowState, _Mapping]] = ..., lost_to: _Optional[_Union[StateLostTo, str]] = ..., message: _Optional[str] = ...) -> None: ...
