# The two commands a new user needs: `make demo` and `make test`.
# Everything is installed into .venv by the targets themselves.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# Spark binds to loopback only: this machine's other addresses are off limits.
export SPARK_LOCAL_IP := 127.0.0.1

JARS   := jars/.resolved

.PHONY: demo test test-unit chaos partition jepsen bench jars clean device-wheels

# rmq_spark._bytecode: Spark's Python workers import pyspark from its zip, which
# zipimport never byte-compiles (~1 s more for every streaming query's start).
# compat editable mode: Spark finds `pyspark_rocketmq` with pkgutil.iter_modules,
# which cannot see setuptools' default (import-hook) editable install.
$(STAMP): setup.py pyproject.toml storage_service/proto/*.proto
	command -v java >/dev/null || (apt-get update -q && apt-get install -y -q openjdk-17-jre-headless)
	# the status page's test drives Debian's headless chromium (tests/test_http_api.py)
	command -v chromedriver >/dev/null || (apt-get update -q && apt-get install -y -q chromium chromium-driver)
	command -v curl >/dev/null || (apt-get update -q && apt-get install -y -q curl)    # the README's HTTP tour
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[server,test,spark,notebook]' --config-settings editable_mode=compat
	$(PY) -m compileall -q rmq_spark storage_service pyspark_rocketmq.py
	$(PY) -m rmq_spark._bytecode
	touch $@

# The JVM jars: Delta Lake and Hadoop's S3A (with the AWS SDK modules it uses), resolved
# by Maven (cached in ~/.m2) into jars/; then our own JVM code (jars/src: the Delta log
# store for S3 and the real-time streaming source format("rocketmq-rt")), compiled with
# javac against the pyspark wheel's jars (Spark, Hadoop, Jackson) into rmq-spark-jvm.jar.
JVM_SRC := $(wildcard jars/src/io/rmqspark/*/*.java) jars/src/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister
$(JARS): jars/pom.xml $(JVM_SRC) $(STAMP)
	command -v javac >/dev/null || (apt-get update -q && apt-get install -y -q openjdk-17-jdk-headless)
	command -v mvn >/dev/null || (apt-get update -q && apt-get install -y -q maven)
	rm -f jars/*.jar
	mvn -q -B -f jars/pom.xml dependency:copy-dependencies -DoutputDirectory=. -DexcludeTransitive=true
	rm -rf build/jvm && mkdir -p build/jvm/META-INF/services
	javac -nowarn --release 17 -d build/jvm \
	  -cp "$$($(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')/*:jars/*" \
	  $(filter %.java,$(JVM_SRC))
	cp jars/src/META-INF/services/* build/jvm/META-INF/services/
	jar cf jars/rmq-spark-jvm.jar -C build/jvm .
	# the driver JVM's class archive (rmq_spark/_class_archive.py): every Spark job starts faster
	$(PY) -m rmq_spark._class_archive jars/spark-classes.jsa
	touch $@

jars: $(JARS)

demo: $(STAMP) $(JARS)
	$(PY) -m rmq_spark.demo

# Two test processes (pytest-xdist), each module's tests in one of them (module-scoped
# clusters and SparkSessions stay shared): most tests wait on nodes, JVMs and subprocesses.
# The longest modules go first (tests/conftest.py, SLOW_MODULES); the slowest tests are listed.
TEST_WORKERS ?= 2
test: $(STAMP) $(JARS)
	$(PY) -m pytest -m "not chaos" -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=15 $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -m unit -q

chaos: $(STAMP)
	$(PY) -m pytest -m chaos -q -s

# Nodes in network namespaces (root and iproute2's ip, as on CI); every scenario 60 s.
partition: $(STAMP)
	$(PY) -m pytest -m partition -q -s

# The partition scenarios (leader cut off, majority/minority, bridge, node cut off,
# flapping), one summary line each: acked lost duplicated reordered
# replica_mismatches stale_reads max_unavailable_s ... Nodes in network namespaces.
# Then the node scenarios (disk full, clock jumps, power loss, bit rot): the same counts.
JEPSEN_SECONDS ?= 60
jepsen: $(STAMP)
	$(PY) -m tests.partition_harness --seconds $(JEPSEN_SECONDS) --fsync always
	$(PY) -m tests.node_faults --seconds $(JEPSEN_SECONDS) --fsync always

bench: $(STAMP) $(JARS)
	$(PY) bench/produce.py
	$(PY) bench/spark_read.py
	$(PY) bench/spark_write.py

clean:
	rm -rf $(VENV) build *.egg-info storage_service/proto/*_pb2*.py jars/*.jar $(JARS)

# cp312 wheels of what bench/scale.py needs, for a lent many-core host without network
# (bench/device/run.sh), at the versions of this tree's .venv
device-wheels: $(STAMP)
	rm -rf bench/device/wheels && mkdir -p bench/device/wheels
	$(PIP) freeze | grep -iE "^($$(grep -v '^#' bench/device/requirements.txt | paste -sd'|'))==" > bench/device/wheels/pins.txt
	# pysyncobj is published as a source archive only: a pure-Python wheel built here
	$(PIP) wheel -q --no-deps -w bench/device/wheels $$(grep -i '^pysyncobj==' bench/device/wheels/pins.txt)
	grep -vi '^pysyncobj==' bench/device/wheels/pins.txt > bench/device/wheels/binary.txt
	$(PIP) download -q --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 \
		-d bench/device/wheels -r bench/device/wheels/binary.txt
	du -sh bench/device/wheels
