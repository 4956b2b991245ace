"""Which data groups a node hosts when it starts.

A node hosts the metadata group and the data groups placed on it. At a
cluster's first start every founding node computes the same placement
(``placement.initial_replicas``: RF replicas per group) and opens the groups
it is given; the metadata leader then records it (``SetPlacement``), and
from there the record decides. At a restart a node opens the replicas it
has on disk (each with its ``members`` file, raft/membership.py).

A data directory written before wave 2 (every node held every group, and no
replica has a ``members`` file) keeps that layout: every group on every
node, whatever the replication factor asked now.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

from ..protocol.placement import initial_replicas
from ..raft.membership import MEMBERS_FILE

__all__ = ["hosted_on_disk", "initial_layout", "joined_groups", "record_join"]

JOINED_FILE = "joined.json"


def hosted_on_disk(data_dir: str) -> list[int]:
    """Data groups with a replica in ``data_dir`` (its ``group-<g>`` directories)."""
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n[6:]) for n in names if n.startswith("group-") and n[6:].isdigit() and int(n[6:]) > 0)


def _legacy(data_dir: str) -> bool:
    on_disk = hosted_on_disk(data_dir)
    return bool(on_disk) and not any(os.path.exists(os.path.join(data_dir, f"group-{g}", MEMBERS_FILE))
                                     for g in on_disk)


def initial_layout(addresses: Sequence[str], groups: int, replication: int,
                   data_dir: str) -> dict[int, list[str]]:
    """Data group -> replicas (gRPC addresses) as a node starts: a wave-1 directory
    keeps every group on every node; otherwise ``initial_replicas``."""
    if _legacy(data_dir):
        return {g: list(addresses) for g in range(1, groups + 1)}
    return initial_replicas(list(addresses), groups, replication)


def record_join(data_dir: str, groups: int) -> None:
    """What a node that joined a running cluster must know at every restart: the
    cluster's original number of data groups (the hash placement of old topics)."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, JOINED_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump({"groups": groups}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def joined_groups(data_dir: str) -> int:
    with open(os.path.join(data_dir, JOINED_FILE)) as f:
        return int(json.load(f)["groups"])
