#!/usr/bin/env bash
# A journaled ext4 for bench data (needs root and a loop device), as a storage host's data
# disk would be: this project's VMs run on an ext4 root without a journal, where making a
# file or directory after many deletions costs up to 25x more (bench/scale.py: file_system).
#   bash bench/journaled_fs.sh [MOUNTPOINT] [SIZE]   then   bench/scale.py --dir MOUNTPOINT
set -euo pipefail
mnt=${1:-/mnt/rmq-bench}
size=${2:-12G}
img=/var/tmp/rmq-bench-ext4.img
if mountpoint -q "$mnt"; then echo "$mnt"; exit 0; fi
mkdir -p "$mnt"
truncate -s "$size" "$img"
mkfs.ext4 -q -F "$img"
mount -o loop "$img" "$mnt"
echo "$mnt"
