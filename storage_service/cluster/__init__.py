"""Cluster control of a node: the placement controller (on the metadata leader), the
replicas a node holds and the changes asked of it, racks, catch-up from peers, upkeep
(retention, compaction, TTL deletes) and the repair of bit rot. Used by ``server.node``."""
