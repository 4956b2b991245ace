"""The HTTP/JSON API's routes: each is one gRPC method of the service (named as the
route, so metrics, ACLs and errors read the same).

    GET    /                                   status page (status.html)
    GET    /metrics                            Prometheus text format
    GET    /v1/status                          what the status page shows, as JSON
    GET    /v1/cluster                         ClusterStatus
    GET    /v1/topics                          ListTopics
    POST   /v1/topics                          CreateTopic   {"name": ..., "queues": ..., ...}
    GET    /v1/topics/{topic}                  DescribeTopic
    DELETE /v1/topics/{topic}                  DeleteTopic
    POST   /v1/topics/{topic}/messages         Produce       [{"key", "value", "tags", "properties"}]
    GET    /v1/topics/{topic}/queues/{queue}/messages?offset=N&max=M   Fetch (JSON, or encoding=batches)
    GET    /v1/consumer-groups/{group}/topics/{topic}/offsets          GetCommittedOffsets (+ lag)
    POST   /v1/consumer-groups/{group}/topics/{topic}/offsets          CommitOffsets {"offsets": {"0": N}}
    GET    /v1/kv/{topic}/{key}?revision=N     KvRead        the key's value and revision (404: none)
    PUT    /v1/kv/{topic}/{key}                KvPut         {"value": ...}; If-Match: REVISION, If-None-Match: *
    DELETE /v1/kv/{topic}/{key}                KvPut         a delete; If-Match: REVISION
    (a failed If-Match / If-None-Match is 412, naming the key's current revision)
"""
from __future__ import annotations

import json
import os

import grpc
from aiohttp import web

from ..proto import rmq_pb2
from ..protocol.fetch_wire import decode_fetch_response
from ..protocol.errors import CallFailed
from .convert import (INT32, INT64, BadRequest, _bytes_from, bytes_json, int_param, int_value, message_json,
                      messages_from_json, parse_into, records_json)
from .server import HttpServer, error_response, json_body, json_response, parse_json
from .status import cluster_view

__all__ = ["add_routes", "MAX_FETCH_MESSAGES"]
BATCHES_TYPE = "application/x-rmq-batches"     # a Fetch answered with encoding=batches

MAX_FETCH_MESSAGES = 10_000
DEFAULT_FETCH_MESSAGES = 100
PAGE = os.path.join(os.path.dirname(__file__), "status.html")


def add_routes(http: HttpServer) -> None:
    r = http.app.router
    page = open(PAGE, "rb").read()

    async def status_page(request):
        return web.Response(body=page, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    async def metrics(request):
        if http.node.metrics is None:
            raise CallFailed(grpc.StatusCode.NOT_FOUND, "this node runs with --no-metrics: nothing is "
                                                        "counted, /metrics is off")
        body = await http.in_pool(request, "Metrics", lambda may: http.node.metrics.render())
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def status(request):
        return json_response(await http.in_pool(request, "Status", cluster_view, http.rpc.servicer, http.node))

    async def cluster(request):
        return json_response(message_json(await http.call(request, "ClusterStatus",
                                                          rmq_pb2.ClusterStatusRequest())))

    async def list_topics(request):
        resp = await http.call(request, "ListTopics", rmq_pb2.ListTopicsRequest())
        return json_response({"topics": [message_json(t) for t in resp.topics]})

    async def create_topic(request):
        config = parse_into(parse_json(await json_body(request)), rmq_pb2.TopicConfig())
        resp = await http.call(request, "CreateTopic", rmq_pb2.CreateTopicRequest(config=config))
        return json_response(message_json(resp.config), status=201)

    async def describe_topic(request):
        resp = await http.call(request, "DescribeTopic", rmq_pb2.DescribeTopicRequest(
            name=request.match_info["topic"]))
        return json_response(message_json(resp))

    async def delete_topic(request):
        await http.call(request, "DeleteTopic", rmq_pb2.DeleteTopicRequest(name=request.match_info["topic"]))
        return json_response({"deleted": request.match_info["topic"]})

    async def produce(request):
        raw = await json_body(request)
        query_queue = int_param(request.query, "queue", -1, low=-1, high=INT32) if "queue" in request.query else None
        req = await http.offload(_produce_request, request.match_info["topic"], raw, query_queue)
        resp = await http.call(request, "Produce", req)
        return json_response({"results": [message_json(x) for x in resp.results]})

    async def fetch(request):
        q = request.query
        queue = int_value("queue", request.match_info["queue"], 0, INT32)
        offset = int_param(q, "offset")
        limit = int_param(q, "max", DEFAULT_FETCH_MESSAGES, low=1)
        if limit > MAX_FETCH_MESSAGES:
            raise BadRequest("max", f"{limit}: at most {MAX_FETCH_MESSAGES} messages a request")
        encoding = q.get("encoding", "auto")
        if encoding not in ("auto", "base64", "batches"):
            raise BadRequest("encoding", f"{encoding!r}: use auto (text when UTF-8), base64, or batches "
                                         "(the stored batches as they are, for a client that decodes them)")
        req = rmq_pb2.FetchRequest(topic=request.match_info["topic"], queue=queue, offset=offset,
                                   max_messages=limit, max_bytes=int_param(q, "max_bytes", 0, low=0, high=INT32),
                                   wait_ms=int_param(q, "wait_ms", 0, low=0, high=INT32), tags=q.get("tags", ""))
        wire = await http.call(request, "Fetch", req)
        if encoding == "batches":
            return _fetch_batches(wire)
        body = await http.offload(_fetch_json, req, wire, limit, encoding == "base64")
        return web.Response(body=body, content_type="application/json")

    async def committed(request):
        group, topic = request.match_info["group"], request.match_info["topic"]
        got = await http.call(request, "GetCommittedOffsets", rmq_pb2.GetCommittedOffsetsRequest(
            consumer_group=group, topic=topic))
        offsets = await http.call(request, "Offsets", rmq_pb2.OffsetsRequest(topic=topic))
        c = dict(got.offsets)
        return json_response({"consumer_group": group, "topic": topic, "queues": [
            {"queue": o.queue, "committed": c.get(o.queue), "earliest": o.earliest, "latest": o.latest,
             "lag": o.latest - c.get(o.queue, o.earliest)} for o in offsets.queues]})

    async def commit(request):
        body = parse_json(await json_body(request))
        if not isinstance(body, dict) or set(body) != {"offsets"} or not isinstance(body["offsets"], dict):
            raise BadRequest("offsets", "give {\"offsets\": {\"QUEUE\": OFFSET, ...}}")
        offsets = {}
        for k, v in body["offsets"].items():
            q = int_value(f"offsets.{k}", k, 0, INT32)
            if type(v) is not int:
                raise BadRequest(f"offsets.{k}", f"{v!r}: give an integer offset")
            offsets[q] = int_value(f"offsets.{k}", v, None)
        await http.call(request, "CommitOffsets", rmq_pb2.CommitOffsetsRequest(
            consumer_group=request.match_info["group"], topic=request.match_info["topic"], offsets=offsets))
        return json_response({"committed": {str(q): o for q, o in sorted(offsets.items())}})

    def _kv_put_request(request, value: bytes, delete: bool) -> rmq_pb2.KvPutRequest:
        req = rmq_pb2.KvPutRequest(topic=request.match_info["topic"], key=request.match_info["key"].encode(),
                                   value=value, delete=delete)
        match, none_match = request.headers.get("If-Match"), request.headers.get("If-None-Match")
        if match is not None and none_match is not None:
            raise BadRequest("If-Match", "give If-Match: REVISION or If-None-Match: *, not both")
        if match is not None:
            req.if_revision = int_value("If-Match", match.strip().strip('"'), 0, INT64)
        if none_match is not None:
            if none_match.strip() != "*":
                raise BadRequest("If-None-Match", f"{none_match!r}: only * (the key has no live value)")
            req.if_absent = True
        return req

    async def _kv_write(request, req) -> web.Response:
        try:
            resp = await http.call(request, "KvPut", req)
        except CallFailed as e:
            if e.code == grpc.StatusCode.ABORTED and e.details.startswith("kv conflict"):
                return error_response(e.code, e.details, status=412)
            raise
        return json_response({"key": req.key.decode(), "revision": resp.revision, "duplicate": resp.duplicate})

    async def kv_get(request):
        req = rmq_pb2.KvReadRequest(topic=request.match_info["topic"], op=rmq_pb2.KvReadRequest.GET,
                                    key=request.match_info["key"].encode())
        if "revision" in request.query:
            req.revision = int_param(request.query, "revision", 0, low=0, high=INT64)
        resp = await http.call(request, "KvRead", req)
        if not resp.entries:
            return error_response(grpc.StatusCode.NOT_FOUND, f"key {request.match_info['key']!r} of topic "
                                  f"{req.topic!r} has no value")
        e = resp.entries[0]
        return json_response({"key": bytes_json(e.key), "value": bytes_json(e.value), "revision": e.revision,
                              "queue": e.queue, "store_timestamp": e.store_timestamp})

    async def kv_put(request):
        body = parse_json(await json_body(request))
        if not isinstance(body, dict) or set(body) != {"value"}:
            raise BadRequest("value", 'give {"value": "..."} (a string, or {"base64": "..."})')
        return await _kv_write(request, _kv_put_request(request, _bytes_from("value", body["value"]), False))

    async def kv_delete(request):
        return await _kv_write(request, _kv_put_request(request, b"", True))

    r.add_get("/", status_page, name="StatusPage")
    r.add_get("/metrics", metrics, name="Metrics")
    r.add_get("/v1/status", status, name="Status")
    r.add_get("/v1/cluster", cluster, name="ClusterStatus")
    r.add_get("/v1/topics", list_topics, name="ListTopics")
    r.add_post("/v1/topics", create_topic, name="CreateTopic")
    r.add_get("/v1/topics/{topic}", describe_topic, name="DescribeTopic")
    r.add_delete("/v1/topics/{topic}", delete_topic, name="DeleteTopic")
    r.add_post("/v1/topics/{topic}/messages", produce, name="Produce")
    r.add_get("/v1/topics/{topic}/queues/{queue}/messages", fetch, name="Fetch")
    r.add_get("/v1/consumer-groups/{group}/topics/{topic}/offsets", committed, name="GetCommittedOffsets")
    r.add_post("/v1/consumer-groups/{group}/topics/{topic}/offsets", commit, name="CommitOffsets")
    r.add_get("/v1/kv/{topic}/{key:.+}", kv_get, name="KvRead")
    r.add_put("/v1/kv/{topic}/{key:.+}", kv_put, name="KvPut")
    r.add_delete("/v1/kv/{topic}/{key:.+}", kv_delete, name="KvDelete")


def _produce_request(topic: str, raw: bytes, query_queue: int | None) -> rmq_pb2.ProduceRequest:
    """A produce body (JSON, base64 decoded) as the gRPC request, in the pool."""
    msgs, queue, producer, sequence = messages_from_json(parse_json(raw), query_queue)
    return rmq_pb2.ProduceRequest(topic=topic, messages=msgs, queue=-1 if queue is None else queue,
                                  producer_id=producer, sequence=sequence)


def _fetch_batches(wire: bytes) -> web.Response:
    """A Fetch answer as its record batches, in the stored framing (``protocol/framing.py``,
    ``protocol/records.py``), with where to go on in headers: no per-record work on the
    node (the JVM source's reads; ``bench/rt_read.py``). The first batch may hold records
    below the offset asked for, and a batch may end past ``max``: readers skip and stop."""
    reply = decode_fetch_response(wire)
    if reply.local is not None:         # never asked for (no local_host): it would skip records
        raise CallFailed(grpc.StatusCode.INTERNAL, "a fetch answered with a local span over HTTP")
    return web.Response(body=bytes(reply.batches), content_type=BATCHES_TYPE, headers={
        "X-Rmq-Next-Offset": str(reply.next_offset), "X-Rmq-Earliest": str(reply.earliest),
        "X-Rmq-Latest": str(reply.latest), "X-Rmq-Served-By": reply.served_by})


def _fetch_json(req: rmq_pb2.FetchRequest, wire: bytes, limit: int, force_base64: bool) -> bytes:
    """A Fetch answer as the JSON body, in the pool. The node keeps whole batches, so it
    may hand more records than ``limit``: then ``next_offset`` follows the last record
    shown, not the batches (a reader following it misses nothing)."""
    reply = decode_fetch_response(wire)
    msgs = records_json(reply.batches, req.offset, limit, force_base64)
    nxt = msgs[-1]["offset"] + 1 if len(msgs) >= limit else reply.next_offset
    return json.dumps({"topic": req.topic, "queue": req.queue, "messages": msgs, "next_offset": nxt,
                       "earliest": reply.earliest, "latest": reply.latest,
                       "served_by": reply.served_by}).encode()
