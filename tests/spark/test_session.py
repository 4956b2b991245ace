"""The driver starts from the class archive ``make jars`` built (rmq_spark/_class_archive.py)."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from rmq_spark.spark import CLASS_ARCHIVE

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_the_driver_maps_the_class_archive_make_built(spark):
    assert os.path.isfile(CLASS_ARCHIVE), "make jars builds it (python -m rmq_spark._class_archive)"
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={CLASS_ARCHIVE}" in args
    # A JVM that cannot use the archive (other JDK, other jars) runs on the JDK's own
    # base archive alone: what it maps is then a fraction of our file's size.
    pid = jvm.java.lang.ProcessHandle.current().pid()
    info = subprocess.run(["jcmd", str(pid), "VM.info"], capture_output=True, text=True, timeout=60).stdout
    mapped = re.search(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)
    assert mapped, info[:2000]
    assert int(mapped.group(1)) > os.path.getsize(CLASS_ARCHIVE)
