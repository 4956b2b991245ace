"""The one grammar of durations and sizes (rmq_spark.units), as the CLI, the
Spark options and the jobs' triggers use it."""
from __future__ import annotations

import pytest

from rmq_spark.client import RmqError
from rmq_spark.compaction import CompactionConfigError
from rmq_spark.datasource import OptionError
from rmq_spark.datasource._options import ReadOptions
from rmq_spark.jobs import JobConfigError, parse_trigger
from rmq_spark.tiering import TierConfigError
from rmq_spark.tiering import parse_trigger as tier_trigger
from rmq_spark.units import (UnitError, human_bytes, human_duration, parse_duration_ms,
                             parse_size_bytes, utc_text)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,ms", [
    ("500ms", 500), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000),
    ("7d", 7 * 86_400_000), ("0s", 0), (" 10S ", 10_000), ("1D", 86_400_000),
])
def test_parse_duration_units(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["0", "forever", "none", "FOREVER"])
def test_parse_duration_no_limit_is_zero(text):
    assert parse_duration_ms(text) == 0


@pytest.mark.parametrize("text", ["", "7", "d", "1.5h", "-1s", "7 days", "10w", "s10", "1h30m"])
def test_parse_duration_bad_input_names_the_input_and_units(text):
    with pytest.raises(ValueError) as e:
        parse_duration_ms(text)
    msg = str(e.value)
    assert repr(text) in msg
    assert "s, m, h or d" in msg and "7d" in msg


@pytest.mark.parametrize("text,n", [
    ("0", 0), ("512", 512), ("512B", 512), ("4KB", 4 << 10), ("4k", 4 << 10),
    ("10MB", 10 << 20), ("10 mb", 10 << 20), ("3GB", 3 << 30), ("2TB", 2 << 40), ("1t", 1 << 40),
])
def test_parse_size_units_are_powers_of_1024(text, n):
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("text", ["", "GB", "1.5GB", "-1KB", "10PB", "10 gigabytes"])
def test_parse_size_bad_input_names_the_input_and_units(text):
    with pytest.raises(ValueError) as e:
        parse_size_bytes(text)
    assert repr(text) in str(e.value) and "GB" in str(e.value)


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(10 << 30) == "10.0 GiB"
    assert human_bytes(5 << 50) == "5120.0 TiB"


@pytest.mark.parametrize("text,ms", [
    ("15min", 900_000), ("2 h", 7_200_000), ("500 MS", 500), ("0", 0), ("000", 0),
])
def test_parse_duration_blanks_min_and_a_bare_zero(text, ms):
    assert parse_duration_ms(text) == ms


def test_bare_number_takes_the_callers_unit():
    assert parse_duration_ms("250", bare_unit="ms") == 250
    assert parse_duration_ms("3", bare_unit="s") == 3000
    with pytest.raises(UnitError, match="a bare number is in ms"):
        parse_duration_ms("soon", bare_unit="ms")


def test_no_limit_words_only_where_zero_means_no_limit():
    with pytest.raises(UnitError) as e:
        parse_duration_ms("forever", no_limit=False)
    assert "'forever' is not a duration" in str(e.value) and "forever" not in str(e.value)[20:]


def test_unit_error_is_in_the_tree_and_a_value_error():
    with pytest.raises(UnitError) as e:
        parse_size_bytes("lots", what="retention size")
    assert isinstance(e.value, RmqError) and isinstance(e.value, ValueError)
    assert not e.value.retriable
    assert str(e.value).startswith("'lots' is not a retention size: ")


def test_spark_option_durations_are_the_same_grammar():
    base = {"endpoints": "h:1", "topic": "t"}
    for text, ms in (("30s", 30_000), ("250", 250), ("15min", 900_000), (" 2 H ", 7_200_000)):
        assert ReadOptions.from_options({**base, "maxTriggerDelay": text}).max_trigger_delay_ms == ms
    for text in ("soon", "forever", "1.5h", "-1s"):
        with pytest.raises(OptionError) as e:
            ReadOptions.from_options({**base, "maxTriggerDelay": text})
        assert e.value.option == "maxTriggerDelay" and repr(text) in str(e.value)
        assert "ms, s, m, h or d" in str(e.value)


@pytest.mark.parametrize("text,kw", [
    ("available-now", {"availableNow": True}), ("AvailableNow", {"availableNow": True}),
    ("500ms", {"processingTime": "500 milliseconds"}), ("30 s", {"processingTime": "30000 milliseconds"}),
    ("1h", {"processingTime": "3600000 milliseconds"}), ("1d", {"processingTime": "86400000 milliseconds"}),
])
def test_trigger_is_available_now_or_an_interval(text, kw):
    assert parse_trigger(text) == kw


@pytest.mark.parametrize("text", ["soon", "0s", "0", "30", "forever", ""])
def test_bad_trigger_names_it_and_the_forms_in_the_jobs_own_error(text):
    for parse, cls in ((parse_trigger, JobConfigError), (tier_trigger, TierConfigError),
                       (lambda t: parse_trigger(t, CompactionConfigError), CompactionConfigError)):
        with pytest.raises(cls) as e:
            parse(text)
        assert repr(text) in str(e.value) and "available-now" in str(e.value)
        assert "30s" in str(e.value) and isinstance(e.value, ValueError)


def test_human_duration_is_the_largest_whole_unit():
    assert [human_duration(ms) for ms in (0, 1500, 30_000, 5 * 60_000, 7 * 86_400_000, 90 * 60_000)] \
        == ["forever", "1500ms", "30s", "5m", "7d", "90m"]
    assert human_duration(0, zero="0") == "0"
    for text in ("7d", "12h", "90m", "1500ms"):
        assert human_duration(parse_duration_ms(text)) == text


def test_utc_text():
    assert utc_text(0) == "1970-01-01 00:00:00 UTC"
    assert utc_text(1_700_000_000_123) == "2023-11-14 22:13:20 UTC"


def test_the_nodes_flags_take_the_same_grammar_and_plain_numbers(capsys):
    """``rmq-storage node``'s duration and size flags read the grammar of the client and the
    CLI (``storage_service/protocol/units.py``) and keep taking plain numbers (seconds,
    bytes); a bad value is refused naming the flag and the forms."""
    from storage_service.cli import _parse

    base = ["node", "--id", "0", "--nodes", "127.0.0.1:1", "--data-dir", "/nonexistent"]
    a = _parse(base + ["--segment-bytes", "64MiB", "--min-free-bytes", "1GB", "--retention-interval", "500ms",
                       "--scrub-interval", "6h", "--repair-after", "5m", "--max-message-bytes", "4M"])
    assert (a.segment_bytes, a.min_free_bytes, a.max_message_bytes) == (64 << 20, 1 << 30, 4 << 20)
    assert (a.retention_interval, a.scrub_interval, a.repair_after) == (0.5, 21_600.0, 300.0)
    a = _parse(base + ["--segment-bytes", "65536", "--retention-interval", "0.5"])
    assert (a.segment_bytes, a.retention_interval) == (65536, 0.5)
    for flag, bad in (("--segment-bytes", "64XB"), ("--retention-interval", "5 weeks")):
        with pytest.raises(SystemExit):
            _parse(base + [flag, bad])
        err = capsys.readouterr().err
        assert f"argument {flag}: '{bad}' is not a {flag}" in err and "e.g." in err, err


def test_the_nodes_and_local_clusters_count_flags_refuse_values_out_of_range(capsys):
    """A count (groups, nodes, limits, a port) outside its range is refused naming the flag
    and the range, and what 0 means where 0 is allowed, before anything starts: a node
    with ``--max-requests 0`` ran and refused every call, one with ``--groups 0`` ran
    with no data group."""
    from storage_service.cli import _parse

    base = ["node", "--id", "0", "--nodes", "127.0.0.1:1", "--data-dir", "/nonexistent"]
    a = _parse(base + ["--groups", "2", "--max-requests", "1", "--max-parked-fetches", "1", "--max-open-files", "0",
                       "--metrics-max-queue-series", "0", "--compaction-entries", "1", "--max-queues", "1",
                       "--journal-sync-threads", "64"])
    assert (a.groups, a.max_requests, a.max_parked_fetches, a.max_open_files) == (2, 1, 1, 0)
    assert a.journal_sync_threads == 64 and _parse(base).journal_sync_threads == 1
    assert (a.metrics_max_queue_series, a.compaction_entries, a.max_queues) == (0, 1, 1)
    for flag, bad, says in (("--max-requests", "0", "1 or more"), ("--groups", "-1", "1 or more"),
                            ("--max-parked-fetches", "x", "1 or more"), ("--compaction-entries", "0", "1 or more"),
                            ("--max-queues", "0", "1 or more"), ("--journal-sync-threads", "0", "1 to 64"),
                            ("--journal-sync-threads", "65", "1 to 64"),
                            ("--max-open-files", "-5", "0 or more (0: half the descriptor limit)"),
                            ("--metrics-max-queue-series", "-1", "0 or more (0: per-topic series only)")):
        with pytest.raises(SystemExit) as e:
            _parse(base + [flag, bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: '{bad}': give an integer, {says}" in err, err
    assert _parse(["local", "--nodes", "1", "--port", "65535", "--racks", "0"]).port == 65535
    for flag, bad, says in (("--nodes", "0", "1 or more"), ("--groups", "0", "1 or more"),
                            ("--port", "70000", "0 to 65,535 (0: OS-assigned)"),
                            ("--racks", "-2", "0 or more (0: no racks)")):
        with pytest.raises(SystemExit):
            _parse(["local", flag, bad])
        err = capsys.readouterr().err
        assert f"argument {flag}: '{bad}': give an integer, {says}" in err, err
