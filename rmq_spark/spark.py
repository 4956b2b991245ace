"""SparkSession set-up with Delta Lake and S3A from the project's ``jars/`` directory.

``make`` resolves the Delta and S3A jars with Maven into ``jars/`` (see
jars/pom.xml), so no job downloads anything at run time.
"""
from __future__ import annotations

import glob
import os
import sys
import tempfile
from contextlib import contextmanager

__all__ = ["CLASS_ARCHIVE", "JARS_DIR", "QUIET_CDS", "SHORT_LIVED_JVM", "class_archive_options", "delta_jars",
           "s3a_conf", "session_builder", "session_conf", "worker_python"]

JARS_DIR = os.environ.get("RMQ_SPARK_JARS", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "jars"))


# Our Delta log store for S3 (jars/src): a commit is a put that fails if the file exists.
CONDITIONAL_LOG_STORE = "io.rmqspark.delta.ConditionalPutLogStore"
_NEEDED_JARS = ("delta-spark", "hadoop-aws", "rmq-spark-jvm")
# Shuffle (and Delta state) partitions of a session on a local master.
LOCAL_PARTITIONS = 4
# The driver JVM's class archive (``rmq_spark/_class_archive.py``, built by ``make jars``).
CLASS_ARCHIVE = os.path.join(JARS_DIR, "spark-classes.jsa")
# A JVM that cannot use (or write) the archive says so on the job's stdout otherwise.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# For a driver that lives a minute or less (the class archive run; the tests' job
# processes): C1 alone and the serial GC cost less CPU than they lose in speed.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def delta_jars() -> list[str]:
    """The Delta jars in ``JARS_DIR``; a clear error if they were never resolved."""
    jars = sorted(glob.glob(os.path.join(JARS_DIR, "*.jar")))
    missing = [n for n in _NEEDED_JARS if not any(os.path.basename(j).startswith(n) for j in jars)]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not in {JARS_DIR}: run `make jars` (Maven "
                                "resolves jars/pom.xml; our JVM code is built from jars/src), "
                                "or point RMQ_SPARK_JARS at a folder holding them")
    return jars


def worker_python() -> str:
    """The Python Spark's workers run: ``PYSPARK_PYTHON`` if set, else this one.

    Spark starts its Python workers with ``python3`` from PATH by default; from a
    shell without the project's venv on PATH that Python lacks ``rmq_spark`` and
    every read fails with ``DATA_SOURCE_NOT_FOUND ... rocketmq``.
    """
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def s3a_conf(env=None) -> dict[str, str]:
    """Hadoop S3A settings (``spark.hadoop.fs.s3a.*``) from the AWS environment, so
    Spark reaches the same store as the Python side (``rmq_spark.fs``):

    * ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (an S3-compatible store):
      ``fs.s3a.endpoint`` and path-style access;
    * ``AWS_REGION`` / ``AWS_DEFAULT_REGION``: ``fs.s3a.endpoint.region``;
    * ``AWS_PROFILE``: the profile credentials provider joins S3A's default chain
      (``fs.s3a.access.key`` settings, the ``AWS_*`` key variables, instance roles);
    * always ``fs.s3a.input.stream.type=classic``: Hadoop 3.5's default stream
      keeps state for every object a long-running job ever read (HADOOP-20058);
      ``fs.s3a.create.performance``: no existence probe per file written.

    Keys are never put into the conf (it shows in Spark's UI and event logs): S3A
    reads them from the environment itself. A conf set on the builder after this
    one wins.
    """
    env = os.environ if env is None else env
    conf = {"spark.hadoop.fs.s3a.input.stream.type": "classic",
            # Spark names every file it writes uniquely (and Delta commits go through
            # ConditionalPutLogStore): no HEAD + LIST "does it exist" probe per create
            "spark.hadoop.fs.s3a.create.performance": "true"}
    # (Not delta.enableFastS3AListFrom: Delta 4.4 calls an S3A method whose signature
    # Hadoop 3.5 changed - NoSuchMethodError on the first commit.)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    if env.get("AWS_PROFILE"):
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = ",".join((
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
            "software.amazon.awssdk.auth.credentials.ProfileCredentialsProvider",
            "org.apache.hadoop.fs.s3a.auth.IAMInstanceCredentialsProvider"))
    return conf


def class_archive_options(path: str = CLASS_ARCHIVE) -> str:
    """JVM options that start a driver from the class archive at ``path``, or "" when
    there is none. A JVM that cannot use it (another JDK, other pyspark jars) starts
    without it, silently: its warning would be on the job's stdout."""
    if not os.path.isfile(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET_CDS}"


def session_builder(app_name: str = "rmq-spark", master: str | None = "local[2]"):
    """A ``SparkSession.Builder`` with the Delta extension and catalog configured,
    and Python workers that run this interpreter (``worker_python``).

    The driver starts from the class archive ``make jars`` builds (``CLASS_ARCHIVE``)
    when it is there, through ``spark.driver.defaultJavaOptions``, which leaves
    ``spark.driver.extraJavaOptions`` to the caller. It takes effect only where the
    builder starts the JVM (a new application, not ``spark-submit``'s)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")     # loopback only
    os.environ["PYSPARK_PYTHON"] = worker_python()
    b = (SparkSession.builder.appName(app_name)
         .config("spark.pyspark.python", worker_python())
         # Our jobs keep no managed tables: Spark's default warehouse would be a
         # spark-warehouse/ folder left in whatever directory a job ran from.
         .config("spark.sql.warehouse.dir", os.path.join(tempfile.gettempdir(), "rmq-spark-warehouse"))
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.jars", ",".join(delta_jars()))
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config("spark.sql.shuffle.partitions", str(LOCAL_PARTITIONS))
         .config("spark.ui.showConsoleProgress", "false"))
    for k, v in s3a_conf().items():
        b = b.config(k, v)
    for scheme in ("s3a", "s3"):      # commits that cannot overwrite another driver's
        b = b.config(f"spark.delta.logStore.{scheme}.impl", CONDITIONAL_LOG_STORE)
    archive = class_archive_options()
    if archive:
        b = b.config("spark.driver.defaultJavaOptions", archive)
    if master and master.startswith("local"):
        # Delta rebuilds a table's state (its log replayed) as a shuffle into 50
        # partitions unless told otherwise: 50 tasks each time a job looks at a table
        # it has not cached, which on a local master took two thirds of the test
        # session's stage time (event log, 2026-11-29). A cluster keeps Delta's default.
        b = b.config("spark.databricks.delta.snapshotPartitions", str(LOCAL_PARTITIONS))
    return b.master(master) if master else b


@contextmanager
def session_conf(spark, conf: dict[str, str]):
    """Set SQL confs on ``spark`` for the duration of the block, then restore them.

    A streaming query clones its session's confs at ``start()``; a Delta
    idempotent DML write reads them when it commits.
    """
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
