"""A ProduceBatches call's answer, batch by batch: a ``ProduceResult`` or the batch's error
(``Client.produce_batches`` and the pipelined ``Producer`` read them alike)."""
from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout

import grpc

from storage_service.proto import rmq_pb2

from ._types import ProduceResult
from .errors import RmqError, from_rpc_error, from_status

__all__ = ["outcomes", "result"]


def result(r: rmq_pb2.ProduceResult) -> ProduceResult:
    return ProduceResult(r.queue, r.base_offset, r.count, r.store_timestamp, r.duplicate)


def outcomes(call, address: str, n: int, timeout: float | None = None) -> list[ProduceResult | RmqError]:
    """The ``n`` outcomes of one ProduceBatches call (a future, or the exception it could
    not even be started with): every one the call's error when it failed as a whole, or
    answered a different number of outcomes. ``timeout``: how long this caller waits
    (a request shared with other callers runs to the latest of their deadlines:
    ``ProduceSender``); past it, DEADLINE_EXCEEDED for each."""
    if isinstance(call, BaseException):
        err = call if isinstance(call, RmqError) else from_status(grpc.StatusCode.UNAVAILABLE, str(call), None,
                                                                  address)
        return [err] * n
    try:
        answer = call.result(timeout)
    except (FutureTimeout, grpc.FutureTimeoutError):
        return [from_status(grpc.StatusCode.DEADLINE_EXCEEDED, f"ProduceBatches to {address}: no answer "
                            f"within {timeout:.3g} s", None, address)] * n
    except grpc.RpcError as e:
        return [from_rpc_error(e, address)] * n
    except Exception as e:
        return [from_status(grpc.StatusCode.UNAVAILABLE, f"ProduceBatches failed: {e!r}", None, address)] * n
    # (a ProduceBatchesResponse, or the outcomes a shared RPC handed this call: ProduceSender)
    got = list(answer.outcomes if hasattr(answer, "outcomes") else answer)
    if len(got) != n:
        return [from_status(grpc.StatusCode.UNAVAILABLE,
                            f"ProduceBatches answered {len(got)} outcomes for {n} batches", None, address)] * n
    return [from_status(o.code, o.message, o.leader, address, str(o.retry_after_ms or "") or None)
            if o.code else result(o.result) for o in got]
