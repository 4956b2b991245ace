"""Synchronous, thread-safe client for the rmq storage service."""
from ._types import FetchResult, Message, ProduceResult, QueueOffsets, Record
from storage_service.protocol.tls import TlsFiles

from .client import Client, parse_endpoints
from .errors import (AlreadyExists, DeadlineExceeded, FailedPrecondition, InternalError,
                     InvalidArgument, NotFound, NotLeader, OutOfRange, Overloaded, ResourceExhausted,
                     PermissionDenied, RmqError, TlsRefused, Unauthenticated, Unavailable)

__all__ = ["Client", "TlsFiles", "parse_endpoints", "Message", "Record", "ProduceResult", "FetchResult",
           "QueueOffsets", "RmqError", "InvalidArgument", "NotFound", "AlreadyExists",
           "OutOfRange", "ResourceExhausted", "Overloaded", "FailedPrecondition", "Unavailable", "NotLeader",
           "DeadlineExceeded", "InternalError", "PermissionDenied", "Unauthenticated", "TlsRefused"]
