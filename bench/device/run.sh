#!/bin/bash
# Issue 39's many-core rows on a lent host (16 cores, Python 3.12, no network), in one go:
#   make device-wheels        # here: cp312 wheels -> bench/device/wheels/ (~32 MB)
#   run (device tool): bash bench/device/run.sh   carrying bench/device/wheels and the
#     generated stubs storage_service/proto/rmq_pb2.py, storage_service/proto/rmq_pb2_grpc.py
# The wheels go to a --target folder on PYTHONPATH (the host's python3 is itself a venv, so
# no venv of our own); node processes inherit it. Each part writes its own file under $OUT
# as it ends, so a run stopped at its limit still brings back the parts it finished:
#   host.txt (cores, versions, file system), scale.txt + scale.json (3/6/9 nodes, the
#   producer sweep, one pipelined thread), probe.txt (single-message p99 at half load),
#   many.txt (2,000 long-polling consumers), syncs.txt (9 nodes: one journal syncer a node
#   against four, and --fsync none, alternating: what holds 9 nodes on one host).
set -uo pipefail
OUT=${OUT:-/tmp/out}
SECS=${SECONDS_PER_RUN:-6}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
SITE=${SITE:-/tmp/rmq-site}
export PYTHONUNBUFFERED=1
test -f storage_service/proto/rmq_pb2.py || { echo "carry storage_service/proto/rmq_pb2*.py"; exit 2; }
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    bench/device/wheels/*.whl || exit 3
export PYTHONPATH="$SITE"
{
  echo "host: $(nproc) cores, $($PY --version), $(uname -r), $(date -u +%FT%TZ)"
  grep -m1 "model name" /proc/cpuinfo
  free -g | head -2
  df -h /tmp | tail -1
  $PY -c "import grpc, google.protobuf, pysyncobj; print('grpcio', grpc.__version__, 'protobuf', google.protobuf.__version__)"
  timeout 30 $PY bench/fsync.py --size 65536 --entries 100 --rounds 1 2>&1 | tail -8
} 2>&1 | tee "$OUT/host.txt"
step() {   # step NAME SECONDS COMMAND...: one part, its output in $OUT/NAME.txt, bounded
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%T), at most ${limit}s): $*"
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.txt"
  echo "== $name: exit ${PIPESTATUS[0]} at $(date -u +%T)"
  pkill -9 -f "storage_service[.]cli node" 2>/dev/null; true
}
# What holds 9 nodes: one journal syncer a node against four, and no syncs at all.
for v in "--sync-threads 1" "--sync-threads 4" "--fsync none" "--sync-threads 4" "--sync-threads 1"; do
  step syncs ${SYNCS_LIMIT:-45} $PY bench/scale.py --only nodes --nodes 9 --producers 24 --offered 0 --sweep 0 \
      --seconds "$SECS" $v
done
# 3, 6, 9 nodes at full speed and at one offered load; then 12 and 48 producers on 3 nodes,
# each between two runs of 24; then one thread's produce_batches against the pipelined producer.
step scale ${SCALE_LIMIT:-330} $PY bench/scale.py --only nodes --only pipeline --nodes 3 --nodes 6 --nodes 9 \
    --producers 24 --sweep 12 --sweep 48 --seconds "$SECS" --rounds 3 --json "$OUT/scale.json"
# Single-message produce p50 / p99 beside the load (3 nodes, full and half load).
step probe ${PROBE_LIMIT:-75} $PY bench/scale.py --only nodes --nodes 3 --sweep 0 --seconds "$SECS" --probe
# 2,000 long-polling consumers and single-message producers.
step many ${MANY_LIMIT:-60} $PY bench/many_clients.py --pollers 2000 --seconds 20
