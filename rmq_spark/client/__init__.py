"""Synchronous, thread-safe client for the rmq storage service."""
from ._types import FetchResult, Message, ProduceResult, QueueOffsets, Record
from storage_service.protocol.tls import TlsFiles

from ._kv import KvEntry, KvEvent
from ._producer import Producer
from .client import Client, parse_endpoints
from .errors import (Aborted, AlreadyExists, DeadlineExceeded, FailedPrecondition, InternalError,
                     InvalidArgument, KvConflict, NotFound, NotLeader, OutOfRange, Overloaded, ResourceExhausted,
                     OutOfOrderSequence, PermissionDenied, RmqError, TlsRefused, Unauthenticated, Unavailable)

__all__ = ["Client", "Producer", "TlsFiles", "parse_endpoints", "Message", "Record", "ProduceResult", "FetchResult",
           "QueueOffsets", "RmqError", "InvalidArgument", "NotFound", "AlreadyExists",
           "OutOfRange", "ResourceExhausted", "Overloaded", "FailedPrecondition", "Unavailable", "NotLeader",
           "DeadlineExceeded", "InternalError", "PermissionDenied", "Unauthenticated", "TlsRefused",
           "Aborted", "OutOfOrderSequence", "KvConflict", "KvEntry", "KvEvent"]
