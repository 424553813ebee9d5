"""How long to wait before retrying a call, as pure functions of the policy (no I/O).

Two kinds of failure are retried, with one jittered exponential backoff:

- the server could not be reached or answer (`UNAVAILABLE`, `DEADLINE_EXCEEDED`):
  a few attempts, so that a wrong address fails promptly;
- the server refused the call for now because it is overloaded
  (`RESOURCE_EXHAUSTED`, reason `OVERLOADED`): it said nothing was done and how
  long to wait (`google.rpc.RetryInfo`); more attempts, never sooner than asked,
  and spread out by jitter so that the clients it refused together do not all
  come back together.

Either way, no retry starts that could not finish before the call's deadline.
`troth._transport` applies these; the unit tests check them as functions.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

Uniform = Callable[[float, float], float]
"""`random.uniform`, replaced in tests."""

SERVER_JITTER = 0.5
"""A delay the server asked for is stretched by up to this fraction (never shortened)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How calls are retried after `UNAVAILABLE`, `DEADLINE_EXCEEDED` or an overload.

    Attempt n (1-based) that fails waits `min(max_backoff, initial_backoff *
    multiplier ** (n - 1))`, jittered down by up to half, before attempt n + 1;
    after an overload refusal, at least the server's `RetryInfo` delay, jittered
    up by up to half. The defaults give up on an unreachable server after 1.5 to
    3 s of sleeping (`max_attempts`): long enough to ride out a brief blip or a
    replica failover, short enough that a wrong address fails promptly. An
    overloaded server answers, and asks to be called again: that is retried up
    to `overload_attempts` times. An established watch is different: it may have
    waited for days, so it keeps reconnecting through an outage of up to
    `reconnect_window` seconds (a server restart or deploy) before giving up.
    Retries never extend a call past its deadline.
    """

    max_attempts: int = 6
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    reconnect_window: float = 300.0
    overload_attempts: int = 50

    def backoff(self, attempt: int, server_delay: float | None = None) -> float:
        """Seconds to sleep after failed attempt number `attempt` (1-based), with jitter."""
        return backoff(self, attempt, server_delay=server_delay)


def backoff(
    policy: RetryPolicy,
    attempt: int,
    *,
    server_delay: float | None = None,
    uniform: Uniform = random.uniform,
) -> float:
    """Seconds to sleep after failed attempt `attempt` (1-based).

    The exponential ceiling jittered into [ceiling / 2, ceiling]; when the server
    asked for `server_delay` seconds, at least that, jittered into
    [server_delay, server_delay * 1.5].
    """
    ceiling = min(
        policy.max_backoff, policy.initial_backoff * policy.multiplier ** max(0, attempt - 1)
    )
    # Jitter spreads out clients that all lost (or were refused by) the same server at once.
    delay = ceiling * uniform(0.5, 1.0)
    if server_delay is not None and server_delay > 0:
        delay = max(delay, server_delay * uniform(1.0, 1.0 + SERVER_JITTER))
    return delay


def retry_delay(
    policy: RetryPolicy,
    attempt: int,
    *,
    overloaded: bool,
    server_delay: float | None = None,
    remaining: float | None = None,
    limit_attempts: bool = True,
    uniform: Uniform = random.uniform,
) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None to give up.

    Args:
        policy: The retry policy.
        attempt: How many attempts have failed in a row (1-based).
        overloaded: The last failure was an overload refusal (else: unreachable).
        server_delay: The `RetryInfo` delay the server asked for, in seconds.
        remaining: Seconds left before the call's deadline, or None for no deadline.
        limit_attempts: False when the caller bounds retries itself (by time).
        uniform: The jitter's source.
    """
    cap = policy.overload_attempts if overloaded else policy.max_attempts
    if limit_attempts and attempt >= cap:
        return None
    delay = backoff(policy, attempt, server_delay=server_delay, uniform=uniform)
    if remaining is not None and delay >= remaining:
        return None  # the retry could not finish in time: say so now rather than later
    return delay
