"""The gRPC channel arguments troth passes, by name, and the keepalive both ends agree on.

gRPC does not check the keys of an options list: a misspelt key is ignored without a
word. The server once set `grpc.http2.min_recv_ping_interval_without_data_ms`, which is
no argument (the C macro is `GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS`,
its key `grpc.http2.min_ping_interval_without_data_ms`), so it kept gRPC's 5-minute
minimum between pings while the SDK pinged every minute: every idle worker, watch and
console stream was cut off (`GOAWAY ... too_many_pings`) every five minutes.

So every option list troth builds (the SDK's channel, the server, the benchmarks and
tests) takes its keys from the constants here, each named as gRPC's C core names it
(`GRPC_ARG_KEEPALIVE_TIME_MS` -> `ARG_KEEPALIVE_TIME_MS`), and
`tests/unit/test_grpc_args.py` checks every constant, and every `grpc.` key written
anywhere in the repository, against gRPC's own list of names
(`tests/fixtures/grpc_channel_args.txt`, read from grpc's
`include/grpc/impl/channel_arg_names.h`) and against the installed grpcio.

Keepalive. The SDK pings the server every `PING_INTERVAL_MS` while a call or stream
is open (so that a watch waiting for days on a half-open connection notices within
`PING_INTERVAL_MS + PING_TIMEOUT_MS` and reconnects). A gRPC server answers a client
that pings more often than it permits (`ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS`,
5 minutes unless set) with a strike, and the third strike with `GOAWAY
too_many_pings`. The troth server permits pings every `PERMITTED_PING_INTERVAL_MS`
by default (`troth serve --keepalive-min-ping-interval`), derived from the SDK's
interval with room for timer jitter, and refuses at start a setting above
`MAX_PERMITTED_PING_INTERVAL_MS`, which would cut the SDK's streams off again.
Tests shorten `PING_INTERVAL_MS` (private: read each time a channel is made) to hold
idle streams past a short strike window in seconds.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_PERMITTED_PING_INTERVAL_MS",
    "PERMITTED_PING_INTERVAL_MS",
    "PING_INTERVAL_MS",
    "PING_TIMEOUT_MS",
    "client_keepalive",
    "server_keepalive",
]

# -- gRPC's names (include/grpc/impl/channel_arg_names.h, src/core/server/server.h) --

ARG_KEEPALIVE_TIME_MS = "grpc.keepalive_time_ms"
ARG_KEEPALIVE_TIMEOUT_MS = "grpc.keepalive_timeout_ms"
ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS = "grpc.keepalive_permit_without_calls"
ARG_HTTP2_MAX_PINGS_WITHOUT_DATA = "grpc.http2.max_pings_without_data"
ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS = "grpc.http2.min_ping_interval_without_data_ms"
ARG_HTTP2_MAX_PING_STRIKES = "grpc.http2.max_ping_strikes"
ARG_MAX_RECONNECT_BACKOFF_MS = "grpc.max_reconnect_backoff_ms"
ARG_MAX_RECEIVE_MESSAGE_LENGTH = "grpc.max_receive_message_length"
ARG_MAX_SEND_MESSAGE_LENGTH = "grpc.max_send_message_length"
ARG_LB_POLICY_NAME = "grpc.lb_policy_name"
ARG_ALLOW_REUSEPORT = "grpc.so_reuseport"
ARG_USE_LOCAL_SUBCHANNEL_POOL = "grpc.use_local_subchannel_pool"
ARG_SERVER_MAX_UNREQUESTED_TIME_IN_SERVER_SECONDS = "grpc.server_max_unrequested_time_in_server"
ARG_SERVER_MAX_PENDING_REQUESTS = "grpc.server.max_pending_requests"
ARG_SERVER_MAX_PENDING_REQUESTS_HARD_LIMIT = "grpc.server.max_pending_requests_hard_limit"
SSL_TARGET_NAME_OVERRIDE_ARG = "grpc.ssl_target_name_override"

# -- the keepalive both ends agree on --------------------------------------------------

PING_INTERVAL_MS = 60_000
"""How often the SDK pings the server while a call or stream is open (1 minute)."""
PING_TIMEOUT_MS = 20_000
"""How long the SDK waits for a ping's answer before it gives the connection up."""
PERMITTED_PING_INTERVAL_MS = PING_INTERVAL_MS // 6
"""The troth server's default `--keepalive-min-ping-interval` (10 s): the shortest
interval between a client's pings it accepts without a strike, well below the SDK's."""
MAX_PERMITTED_PING_INTERVAL_MS = PING_INTERVAL_MS // 2
"""The longest `--keepalive-min-ping-interval` the server accepts (30 s): pings every
`PING_INTERVAL_MS`, give or take a loaded machine's timer jitter, stay clear of it."""

Options = tuple[tuple[str, Any], ...]
"""gRPC channel or server options, as `grpc.insecure_channel(options=...)` takes them."""


def client_keepalive() -> Options:
    """The SDK channel's keepalive: a ping every `PING_INTERVAL_MS` while a call is open,
    none on an idle channel (nothing waits on it), and pings even while no data flows
    (a watch sends none while it waits; gRPC's default stops after two)."""
    return (
        (ARG_KEEPALIVE_TIME_MS, PING_INTERVAL_MS),
        (ARG_KEEPALIVE_TIMEOUT_MS, PING_TIMEOUT_MS),
        (ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0),
        (ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0),
    )


def server_keepalive(min_ping_interval_ms: int, ping_interval_ms: int) -> Options:
    """A troth server's keepalive: it accepts a client's pings every
    `min_ping_interval_ms` (its `--keepalive-min-ping-interval`), on connections with
    no call open too, and pings its clients every `ping_interval_ms` itself (so that
    it notices a worker whose host died)."""
    return (
        (ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, min_ping_interval_ms),
        (ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1),
        (ARG_KEEPALIVE_TIME_MS, ping_interval_ms),
    )
