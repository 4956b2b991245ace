"""rmq-spark: a raft-replicated message log and its Apache Spark connector.

The gRPC stubs are generated here, from ``storage_service/proto/*.proto``, every
time the package is built or installed (editable installs included), so the
generated ``*_pb2*.py`` files are never edited by hand nor committed.
"""
import glob
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def generate_stubs() -> None:
    from grpc_tools import protoc  # build requirement, see pyproject.toml

    protos = sorted(glob.glob(os.path.join("storage_service", "proto", "*.proto")))
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for proto in protos:
        rc = protoc.main(["grpc_tools.protoc", "-I.", f"-I{include}",
                          "--python_out=.", "--grpc_python_out=.", proto])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto}")


class BuildPyWithStubs(build_py):
    def run(self):
        generate_stubs()
        super().run()


os.chdir(HERE)
generate_stubs()

setup(
    name="rmq-spark",
    version="0.1.0",
    description="Raft-replicated message log with an Apache Spark source/sink, tiering and compaction",
    python_requires=">=3.11",
    packages=find_packages(include=["storage_service*", "rmq_spark*"]),
    py_modules=["pyspark_rocketmq"] if os.path.exists("pyspark_rocketmq.py") else [],
    package_data={"storage_service": ["proto/*.proto", "http/*.html"]},
    # `pip install rmq-spark`: the client, the `rmq` CLI and the Spark connector, which is
    # what a Spark executor needs (issue 42). The storage service's own packages come with
    # `rmq-spark[server]` (make demo and make test install it); without them `rmq-storage`
    # says so (storage_service/launch.py).
    install_requires=[
        "grpcio>=1.60",
        "protobuf>=5",
        "crc32c>=2.4",
        "numpy>=1.26",
        "pyarrow>=15",
    ],
    extras_require={
        "server": [
            "pysyncobj==0.3.17",
            # a cluster's CA and certificates for `rmq-storage local --secure` (security/certs.py)
            "cryptography>=42",
            # bearer tokens (security/tokens.py): standard JWTs (HS256) whose signature, expiry
            # and claims a maintained library checks, readable by any JWT tool
            "PyJWT>=2.8",
            # the HTTP port (storage_service/http): an asyncio HTTP server that runs on the gRPC
            # server's event loop, so HTTP calls share its handlers, limits and parked fetches
            "aiohttp>=3.9,<4",
            # /metrics: Prometheus' own client (text format, histograms, process metrics)
            "prometheus_client>=0.20",
        ],
        "spark": ["pyspark==4.2.0", "delta-spark==4.4.1", "pyarrow>=15", "pandas<3"],
        # hypothesis: property-based fuzzing of every RPC and of the block parsers (issue 18)
        # moto[server]: a real S3-compatible server for the object-store tests (issue 21);
        # deltalake: an independent reader of the archives the tests write there
        # pytest-xdist: `make test` runs the suite in 2 processes (tests mostly wait on nodes,
        # JVMs and subprocesses: 32 min -> 22 min on 2 cores)
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100",
                 "moto[server]==5.2.5",
                 "deltalake>=1.6",
                 # the status page's test drives Debian's chromium (installed by the Makefile)
                 "selenium>=4.20"],
        # the peers of bench/: NATS's Python client, and librdkafka's for the Kafka peer (issue 24;
        # the scripts install them on first use too)
        "bench": ["nats-py>=2.6", "confluent-kafka>=2.6"],
        # Notebooks: executed by the test suite (nbclient) and plotted (matplotlib).
        "notebook": ["nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29", "matplotlib>=3.8"],
    },
    entry_points={
        "console_scripts": [
            "rmq-storage=storage_service.launch:main",
            "rmq=rmq_spark.cli.main:main",
        ],
    },
    cmdclass={"build_py": BuildPyWithStubs},
)
