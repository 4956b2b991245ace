"""What every gRPC method of a node goes through: request decoding and error mapping."""
from __future__ import annotations

import functools
import logging

import grpc
from google.protobuf.message import DecodeError

from ..protocol.errors import ServiceError, invalid

__all__ = ["Undecodable", "_decoder", "_guard"]

log = logging.getLogger("storage_service.server.service")


class Undecodable:
    """A request body that is not the method's message (handed on by ``_decoder``)."""

    def __init__(self, message: str, error: Exception):
        self.message, self.error = message, error


def _decoder(request_cls):
    """The request deserializer: protobuf's, except that a body which is not a
    ``request_cls`` becomes ``Undecodable`` (answered INVALID_ARGUMENT by ``_guard``)
    instead of an exception gRPC would answer INTERNAL."""
    def decode(body: bytes):
        try:
            return request_cls.FromString(body)
        except DecodeError as e:
            return Undecodable(request_cls.__name__, e)
    return decode


def _guard(fn):
    @functools.wraps(fn)
    def wrapper(self, request, context):
        try:
            if isinstance(request, Undecodable):
                raise invalid(f"the request body is not a {request.message}: {request.error}")
            return fn(self, request, context)
        except ServiceError as e:
            context.set_trailing_metadata(e.trailing_metadata())
            context.abort(e.code, e.message)
        except Exception:
            log.exception("%s failed", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error (see node log)")
    return wrapper
