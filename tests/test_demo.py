"""``make demo`` end to end (``python -m rmq_spark.demo``, what the Makefile runs): a
3-node cluster with a node killed and restarted, Spark reading it, tiering and
compaction. The first thing a new user runs; the README's test leaves it out (it is a
console block). It printed an empty raft-groups table and a value padded with 200
blanks, and with the padding gone its compaction check failed (issue 37)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_make_demo_runs_end_to_end_and_shows_what_it_says():
    out = subprocess.run([sys.executable, "-m", "rmq_spark.demo"], capture_output=True, text=True,
                         timeout=900, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    text = out.stdout
    assert out.returncode == 0, text[-3000:] + out.stderr[-3000:]
    assert re.search(r"acknowledged 40,000 messages, read back 40,000: nothing lost", text), text
    table = text.split("raft groups (leader per group):", 1)[1].strip().splitlines()
    rows = [r.split() for r in table[2:7]]
    assert [r[0] for r in rows] == ["0", "1", "2", "3", "4"], table[:8]
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", r[1]) for r in rows), table[:8]    # a leader each
    got = text.split("$ rmq get demo-balances ", 1)[1].splitlines()[1]
    assert re.fullmatch(r"account-\d{4}\t\{\"balance\": \d+, \"update\": \d+\}", got), repr(got)
    m = re.search(r"compacted table: (\d+) keys, (\d+) expected(.*)", text)
    assert m and m.group(1) == m.group(2) and "MISMATCH" not in m.group(3), text[-2000:]
