"""Apache Kafka as a benchmark peer: 3 brokers in KRaft mode on loopback (issue 24).

The broker jars come from Maven Central (``bench/kafka/pom.xml``), resolved
into ``bench/kafka/jars/`` by the first run, as ``make jars`` resolves ours.
Each broker is also a controller ("combined" mode, the way a 3-machine
cluster without separate controllers runs), started as ``java kafka.Kafka
server.properties`` after ``kafka.tools.StorageTool format``, and stopped
with the cluster. Two configurations a Spark user would run:

* ``shipped``: Kafka's defaults (no fsync before an ack: the page cache of
  the in-sync replicas), replication 3, ``min.insync.replicas=2``;
* ``flush=True``: ``log.flush.interval.messages=1``, an fsync per append on
  every replica before it counts (rmq-spark's ``--fsync always``).

    with KafkaCluster(root) as k:
        k.create_topic("bench", partitions=8)
        print(k.bootstrap)
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid

from _peers import free_ports  # (lives next to this file)

__all__ = ["KafkaCluster", "ensure_confluent_kafka", "kafka_jars", "spark_kafka_jars"]

log = logging.getLogger("bench.kafka")
HERE = os.path.dirname(os.path.abspath(__file__))
POM = os.path.join(HERE, "kafka", "pom.xml")
JARS = os.path.join(HERE, "kafka", "jars")


def kafka_jars() -> str:
    """The classpath of the broker (resolving it with Maven on the first call)."""
    stamp = os.path.join(JARS, ".resolved")
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(POM):
        if shutil.which("mvn") is None:
            subprocess.run(["apt-get", "install", "-y", "-q", "maven"], check=True)
        shutil.rmtree(JARS, ignore_errors=True)
        os.makedirs(JARS)
        log.info("resolving Kafka's jars from Maven Central into %s", JARS)
        subprocess.run(["mvn", "-q", "-B", "-f", POM, "dependency:copy-dependencies",
                        f"-DoutputDirectory={JARS}", "-DincludeScope=runtime"], check=True)
        open(stamp, "w").close()
    return os.path.join(JARS, "*")


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka source/sink and what it needs (``kafka/spark-pom.xml``), resolved on
    the first call: the paths, for ``spark.jars``."""
    pom = os.path.join(HERE, "kafka", "spark-pom.xml")
    out = os.path.join(HERE, "kafka", "spark-jars")
    stamp = os.path.join(out, ".resolved")
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(pom):
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        subprocess.run(["mvn", "-q", "-B", "-f", pom, "dependency:copy-dependencies",
                        f"-DoutputDirectory={out}", "-DexcludeTransitive=true"], check=True)
        open(stamp, "w").close()
    return sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".jar"))


def ensure_confluent_kafka() -> str:
    """Import confluent-kafka (librdkafka's Python client), pip-installing it if missing."""
    try:
        import confluent_kafka
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "confluent-kafka>=2.6"], check=True)
        import confluent_kafka
    return confluent_kafka.version()[0]


class KafkaCluster:
    def __init__(self, root: str, brokers: int = 3, flush: bool = False, heap: str = "768m"):
        self.root, self.brokers, self.flush, self.heap = root, brokers, flush, heap
        ports = free_ports(2 * brokers)
        self.ports, self.controller_ports = ports[:brokers], ports[brokers:]
        self.procs: list[subprocess.Popen | None] = []

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _properties(self, i: int) -> str:
        voters = ",".join(f"{j}@127.0.0.1:{p}" for j, p in enumerate(self.controller_ports))
        props = {
            "node.id": i, "process.roles": "broker,controller",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.ports[i]},CONTROLLER://127.0.0.1:{self.controller_ports[i]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.ports[i]}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.quorum.voters": voters,
            "log.dirs": os.path.join(self.root, f"broker-{i}", "data"),
            "num.partitions": 8, "default.replication.factor": self.brokers,
            "min.insync.replicas": min(2, self.brokers),
            "offsets.topic.replication.factor": self.brokers,
            "transaction.state.log.replication.factor": self.brokers,
            "transaction.state.log.min.isr": min(2, self.brokers),
            "group.initial.rebalance.delay.ms": 0, "auto.create.topics.enable": "false",
        }
        if self.flush:
            props["log.flush.interval.messages"] = 1
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def start(self, timeout: float = 120.0) -> "KafkaCluster":
        ensure_confluent_kafka()
        cp = kafka_jars()
        cluster_id = _cluster_id()
        for i in range(self.brokers):
            d = os.path.join(self.root, f"broker-{i}")
            os.makedirs(d, exist_ok=True)
            conf = os.path.join(d, "server.properties")
            with open(conf, "w") as f:
                f.write(self._properties(i))
            subprocess.run(["java", "-cp", cp, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                            "-c", conf], check=True, capture_output=True, timeout=120)
        for i in range(self.brokers):
            d = os.path.join(self.root, f"broker-{i}")
            out = open(os.path.join(d, "broker.log"), "ab")
            self.procs.append(subprocess.Popen(
                ["java", f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                 "-cp", cp, "kafka.Kafka", os.path.join(d, "server.properties")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            out.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})   # (refused while starting)
        deadline = time.monotonic() + timeout
        while True:
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"Kafka broker {i} exited with {p.returncode}: see "
                                       f"{os.path.join(self.root, f'broker-{i}', 'broker.log')}")
            try:
                md = admin.list_topics(timeout=2)
                if len(md.brokers) == self.brokers:
                    return
            except Exception:  # not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kafka not ready after {timeout:.0f} s (logs in {self.root})")
            time.sleep(0.5)

    def create_topic(self, name: str, partitions: int = 8) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fut = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=self.brokers)])[name]
        fut.result(60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:     # every partition with a leader
            t = admin.list_topics(name, timeout=5).topics[name]
            if t.error is None and len(t.partitions) == partitions and all(
                    p.leader >= 0 for p in t.partitions.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"topic {name}: partitions without a leader after 60 s")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.poll() is None]

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        self.procs = []

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 characters)."""
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
