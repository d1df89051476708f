"""What the sync and async stores share to store a traced enqueue's trace context (fairq.otel,
docs/tracing.md): the check of the context, the same one-line refusals as the SQL function's
(trace_jobs), the statement and parameters of an enqueue with or without one, and the read of
a claim's contexts."""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fairq.errors import InvalidInput
from fairq.models import NewJobColumns, TraceContext
from fairq.store.enqueue import enqueue_params

if TYPE_CHECKING:
    from fairq.store.sessions import StoreSessions

# Version 00's form: 55 characters. Version ff and all-zero ids are invalid (W3C Trace Context).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
TRACEPARENT_LENGTH = 55
MAX_TRACESTATE = 512  # what the W3C asks every vendor to pass on


def valid_traceparent(value: object) -> bool:
    """Whether ``value`` is a valid W3C traceparent (job_traces_traceparent_check's rule)."""
    return (isinstance(value, str) and _TRACEPARENT.fullmatch(value) is not None
            and value[:2] != "ff" and value[3:35] != "0" * 32 and value[36:52] != "0" * 16)


def check_trace(trace: TraceContext) -> TraceContext:
    """``trace`` if it can be stored; else ``InvalidInput``, one line, before anything is
    written."""
    if not isinstance(trace, TraceContext):
        raise InvalidInput(f"trace must be a fairq.models.TraceContext, not {type(trace).__name__}")
    if not valid_traceparent(trace.traceparent):
        shown = repr(trace.traceparent)
        if isinstance(trace.traceparent, str) and len(trace.traceparent) > 60:
            shown = f"{trace.traceparent[:60]!r}... ({len(trace.traceparent)} characters)"
        raise InvalidInput(
            f"traceparent must be a W3C traceparent, {TRACEPARENT_LENGTH} characters "
            "(00-<32 hex digits>-<16 hex digits>-<2 hex digits>, lowercase, ids not all zero), "
            f"not {shown}")
    state = trace.tracestate
    if state is not None:
        if not isinstance(state, str):
            raise InvalidInput(f"tracestate must be a str or None, not {type(state).__name__}")
        if len(state) > MAX_TRACESTATE:
            raise InvalidInput(f"tracestate must be at most {MAX_TRACESTATE} characters, "
                               f"not {len(state)}")
        if not all(" " <= c <= "~" for c in state):
            raise InvalidInput("tracestate must be printable ASCII")
    return trace


def enqueue_call(jobs: NewJobColumns, trace: TraceContext | None) -> tuple[str, dict[str, Any]]:
    """The named statement enqueueing one chunk, and its parameters: ``enqueue``, or with a
    (checked) ``trace`` ``enqueue_traced``, which stores it for every job of the chunk in the
    same statement."""
    params = enqueue_params(jobs)
    if trace is None:
        return "enqueue", params
    return "enqueue_traced", {**params, "traceparent": trace.traceparent,
                              "tracestate": trace.tracestate or None}


def claim_traces(store: StoreSessions, started_at: datetime, locked_until: datetime
                 ) -> dict[int, TraceContext | None]:
    """The trace context (None: none) of each job a claim took, found by the claim's
    ``started_at`` and the jobs' ``locked_until`` (jobs of one lease: one read a batch)."""
    with store.cursor() as cur:
        cur.execute(store.statement("get_claim_traces"),
                    {"started_at": started_at, "locked_until": locked_until})
        return {int(r["job_id"]): None if r["traceparent"] is None
                else TraceContext(r["traceparent"], r["tracestate"]) for r in cur.fetchall()}
