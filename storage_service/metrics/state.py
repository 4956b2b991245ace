"""Metrics read from a node's state at scrape time (a prometheus_client collector).

* Per raft group this node holds (every replica reports its own view): term,
  commit and applied index, leading or not, journal entries, snapshots.
* Per queue, **only from the node leading its data group** (so a sum over the
  cluster's nodes counts each queue once, as Kafka reports a partition from
  its leader): earliest and latest offset, bytes; each consumer group's lag
  (latest - committed; latest - earliest without a commit, as ``rmq offsets``);
  the tiering job's lag (latest - the archive watermark) and the compaction
  job's (latest - the compaction watermark), in messages and in seconds (the
  age of the oldest message the job has not done; 0 when caught up).
* Per topic, the same summed over the queues this node leads, always.

Cardinality: per-queue series are exported while they would number at most
``max_queue_series`` (``--metrics-max-queue-series``, default 30,000, ~3 MB a
scrape): 3 per queue this node leads, one more per consumer group of its
topic, two more for a tiered or compacted topic. Past it every per-queue
family is left out (all or nothing: a partial set would make sums lie) and
``rmq_metrics_queues_omitted`` says how many queues were not shown; the
per-topic families still hold every queue. So 100,000 queues on 3 nodes
(~33,000 led by each) give per-topic series only (topics x ~8), plus the
omitted count, and that scrape reads no segment: the seconds-behind figures
come with the per-queue series, each from the headers of the batch at the
job's watermark (``QueueLog.store_ts_at``), remembered until the watermark
moves.
"""
from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..protocol.placement import META_GROUP
from ..statemachine.data import queue_dir

__all__ = ["StateCollector", "DEFAULT_MAX_QUEUE_SERIES"]

DEFAULT_MAX_QUEUE_SERIES = 30_000


def _gauge(name, doc, labels=()):
    return GaugeMetricFamily(name, doc, labels=list(labels))


class StateCollector(Collector):
    def __init__(self, node, max_queue_series: int = DEFAULT_MAX_QUEUE_SERIES, server=None):
        self.node = node
        self.max_queue_series = max_queue_series
        self.server = server            # dispatch.AsyncServer: requests running, fetches parked
        self._ages: dict[tuple[str, int], int] = {}   # (queue dir, watermark) -> its store time (ms)

    def collect(self):
        yield from self._node()
        yield from self._raft()
        yield from self._queues()

    # ----------------------------------------------------------------- node
    def _node(self):
        n = self.node
        up = _gauge("rmq_node_info", "This node: its addresses (value 1)", ["address", "node_id"])
        up.add_metric([n.config.address, str(n.config.node_id)], 1)
        yield up
        g = _gauge("rmq_open_segment_files", "Segment files this node holds open (--max-open-files)")
        g.add_metric([], n.files.count)
        yield g
        g = _gauge("rmq_open_segment_files_limit", "The most segment files this node keeps open")
        g.add_metric([], n.files.limit)
        yield g
        g = _gauge("rmq_disk_free_bytes", "Free space in the node's data directory")
        g.add_metric([], n.disk.free())
        yield g
        g = _gauge("rmq_disk_reserve_bytes", "Free space the node keeps (--min-free-bytes): below it, "
                   "produce is refused")
        g.add_metric([], n.config.min_free_bytes)
        yield g
        if self.server is not None:
            g = _gauge("rmq_requests_in_progress", "Requests running or queued for the node's pool "
                       "(refused past --max-requests)")
            g.add_metric([], self.server.running)
            yield g
            g = _gauge("rmq_parked_fetches", "Long-polling fetches waiting for data (refused past "
                       "--max-parked-fetches)")
            g.add_metric([], self.server.parked)
            yield g

    # ----------------------------------------------------------------- raft
    def _raft(self):
        fams = {k: _gauge(f"rmq_raft_{k}", doc, ["group"]) for k, doc in (
            ("term", "The group's raft term as this replica knows it"),
            ("commit_index", "The group's commit index as this replica knows it"),
            ("applied_index", "The last entry this replica applied"),
            ("leader", "1 if this node leads the group, else 0"),
            ("log_entries", "Entries in this replica's raft journal (compacted by snapshots)"),
            ("snapshot_index", "The last raft index this replica's latest snapshot covers (0: none)"))}
        snaps = CounterMetricFamily("rmq_raft_snapshots", "Snapshots this replica wrote since the node "
                                    "started", labels=["group"])
        waiting = _gauge("rmq_commit_backlog_batches", "Produce batches this leader took and has not "
                         "proposed yet (refused past the per-group limit)", ["group"])
        committers = dict(getattr(self.node, "committers", {}))
        for g, raft in sorted(list(self.node.groups.items())):
            label = [str(g)]
            if g in committers:
                waiting.add_metric(label, committers[g].waiting_items())
            fams["term"].add_metric(label, raft.raftCurrentTerm)
            fams["commit_index"].add_metric(label, raft.raftCommitIndex)
            fams["applied_index"].add_metric(label, raft.raftLastApplied)
            fams["leader"].add_metric(label, 1 if raft.is_leader else 0)
            fams["log_entries"].add_metric(label, len(raft.journal))
            fams["snapshot_index"].add_metric(label, raft.snapshot_index)
            snaps.add_metric(label, raft.snapshots_written)
        yield from fams.values()
        yield snaps
        yield waiting

    # --------------------------------------------------------------- queues
    def _led_queues(self):
        """(topic config, queue, QueueLog or None) of every queue whose data group this node leads."""
        n = self.node
        states = n.states                # one reference: a dropped replica swaps the dict
        led = {g: states[g] for g, raft in list(n.groups.items())
               if g != META_GROUP and raft.is_leader and g in states}
        if not led:
            return []
        out = []
        for cfg in n.meta.list_topics():
            name, inc = cfg["name"], cfg["incarnation"]
            for q in range(cfg["queues"]):
                st = led.get(n.group_of(name, q, cfg))
                if st is not None:
                    out.append((cfg, q, st.queues.get(queue_dir(name, inc, q))))
        return out

    def _series_per_queue(self, queues) -> int:
        """What the per-queue families would hold for ``queues``."""
        meta, cost = self.node.meta, {}
        for cfg, _, _ in queues:
            name = cfg["name"]
            if name not in cost:
                job = cfg.get("cleanup_policy") == "compact" or bool(cfg.get("tier"))
                cost[name] = 3 + len(meta.groups_for(name)) + (2 if job else 0)
        return sum(cost[cfg["name"]] for cfg, _, _ in queues)

    def _queues(self):
        n = self.node
        meta = n.meta
        queues = self._led_queues()
        per_queue = self._series_per_queue(queues) <= self.max_queue_series
        omitted = _gauge("rmq_metrics_queues_omitted", "Queues led here whose per-queue series are not "
                         "exported (more than --metrics-max-queue-series); per-topic series hold them")
        omitted.add_metric([], 0 if per_queue else len(queues))
        yield omitted
        q_lab, t_lab = ["topic", "queue"], ["topic"]
        qf = {k: _gauge(f"rmq_queue_{k}", doc, q_lab) for k, doc in (
            ("earliest_offset", "The queue's earliest offset held in the hot log"),
            ("latest_offset", "The queue's next offset (messages ever appended)"),
            ("bytes", "Bytes of the queue's segments"))}
        tf = {k: _gauge(f"rmq_topic_{k}", doc, t_lab) for k, doc in (
            ("messages", "Messages held in the hot log, over the queues led here"),
            ("latest_offset_sum", "Sum of latest offsets of the queues led here (its rate is the "
                                  "topic's produce rate)"),
            ("bytes", "Bytes of segments, over the queues led here"))}
        lag_q = _gauge("rmq_consumer_group_lag_messages", "latest - committed offset (latest - earliest "
                       "before a first commit), as rmq offsets shows", ["consumer_group", "topic", "queue"])
        lag_t = _gauge("rmq_consumer_group_topic_lag_messages", "Consumer-group lag summed over the "
                       "topic's queues led here", ["consumer_group", "topic"])
        jobs = {}
        for job, doc in (("tiering", "archived (the archive watermark)"),
                         ("compaction", "compacted into the table (the compaction watermark)")):
            jobs[job] = (
                _gauge(f"rmq_{job}_lag_messages", f"Messages not yet {doc}", q_lab),
                _gauge(f"rmq_{job}_lag_seconds", f"Age of the oldest message not yet {doc}; 0 when "
                       "caught up", q_lab),
                _gauge(f"rmq_{job}_topic_lag_messages", f"Messages not yet {doc}, over the queues "
                       "led here", t_lab),
                _gauge(f"rmq_{job}_topic_lag_seconds", "The largest of the topic's per-queue lag in "
                       "seconds (exported with the per-queue series)", t_lab))
        now_ms = time.time() * 1000
        ages, self._ages = self._ages, {}       # keeps what this scrape used
        by_topic: dict[str, tuple[dict, list]] = {}
        for cfg, q, ql in queues:
            by_topic.setdefault(cfg["name"], (cfg, []))[1].append((q, ql))
        for topic, (cfg, items) in by_topic.items():
            committed = {g: meta.committed(g, topic) for g in meta.groups_for(topic)}
            job = ("compaction" if cfg.get("cleanup_policy") == "compact" else
                   "tiering" if cfg.get("tier") else None)
            marks = meta.watermark(topic, "compaction" if job == "compaction" else "archive") if job else {}
            msgs = total_latest = size = 0
            group_lag = dict.fromkeys(committed, 0)
            job_lag, job_secs = 0, 0.0
            for q, ql in items:
                earliest, latest, nbytes = _offsets(ql)
                msgs += latest - earliest
                total_latest += latest
                size += nbytes
                lab = [topic, str(q)]
                if per_queue:
                    qf["earliest_offset"].add_metric(lab, earliest)
                    qf["latest_offset"].add_metric(lab, latest)
                    qf["bytes"].add_metric(lab, nbytes)
                for g, offs in committed.items():
                    lag = latest - offs.get(q, earliest)
                    group_lag[g] += lag
                    if per_queue:
                        lag_q.add_metric([g, topic, str(q)], lag)
                if job:
                    done = max(marks.get(q, 0), earliest)
                    behind = max(0, latest - done)
                    job_lag += behind
                    if per_queue:
                        secs = self._age(ql, done, now_ms, ages) if behind else 0.0
                        job_secs = max(job_secs, secs)
                        jobs[job][0].add_metric(lab, behind)
                        jobs[job][1].add_metric(lab, secs)
            tf["messages"].add_metric([topic], msgs)
            tf["latest_offset_sum"].add_metric([topic], total_latest)
            tf["bytes"].add_metric([topic], size)
            for g, lag in group_lag.items():
                lag_t.add_metric([g, topic], lag)
            if job:
                jobs[job][2].add_metric([topic], job_lag)
                if per_queue:
                    jobs[job][3].add_metric([topic], job_secs)
        yield from tf.values()
        yield lag_t
        for fams in jobs.values():
            yield fams[2]
            yield fams[3]
        if per_queue:
            yield from qf.values()
            yield lag_q
            for fams in jobs.values():
                yield fams[0]
                yield fams[1]

    def _age(self, ql, offset: int, now_ms: float, known: dict) -> float:
        """Seconds since the batch holding ``offset`` was stored (0 if it cannot be read)."""
        if ql is None:
            return 0.0
        key = (ql.path, offset)
        ts = known.get(key)
        if ts is None:
            try:
                ts = ql.store_ts_at(offset)
            except (OSError, ValueError, IndexError):
                ts = None
            if ts is None:
                return 0.0
        self._ages[key] = ts
        return max(0.0, (now_ms - ts) / 1000)


def _offsets(ql) -> tuple[int, int, int]:
    """(earliest, latest, bytes) of a queue log, read under its lock (a reset swaps its segments)."""
    if ql is None:
        return 0, 0, 0
    with ql.lock:
        return ql.earliest, ql.next_offset, ql.size_bytes
