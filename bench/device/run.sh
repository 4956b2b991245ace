#!/bin/bash
# The scale-out bench on a lent many-core host (Python 3.12, no network), in one go:
#   make device-wheels        # here: cp312 wheels -> bench/device/wheels/ (~35 MB)
#   run (device tool): bash bench/device/run.sh   carrying bench/device/wheels and the
#     generated stubs storage_service/proto/rmq_pb2.py, storage_service/proto/rmq_pb2_grpc.py
# Writes $OUT/scale.txt (the tables) and $OUT/scale.json; prints cores and versions first.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=$(command -v python3.12 || command -v python3)
echo "host: $(nproc) cores, $($PY --version)"
$PY -m venv /tmp/rmq-venv
/tmp/rmq-venv/bin/pip install -q --no-index --find-links bench/device/wheels -r bench/device/requirements.txt
test -f storage_service/proto/rmq_pb2.py || { echo "carry storage_service/proto/rmq_pb2*.py"; exit 2; }
cd "$(dirname "$0")/../.."
# 3, 6, 9 nodes at full speed and at one offered load; then 12, 24, 48 producers on 3 nodes;
# then one thread's produce_batches against the pipelined producer.
/tmp/rmq-venv/bin/python bench/scale.py --only nodes --only pipeline --nodes 3 --nodes 6 --nodes 9 \
    --producers 24 --sweep 12 --sweep 24 --sweep 48 --seconds ${SECONDS_PER_RUN:-10} --rounds 3 \
    --json "$OUT/scale.json" 2>&1 | tee "$OUT/scale.txt"
