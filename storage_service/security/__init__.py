"""Security of the nodes: a cluster's certificates (certs.py), bearer tokens (tokens.py),
ACL entries (acl.py), the gate every call of a secured node passes (authz.py) and how
ACL changes hold on every node (meta_sync.py). The TLS settings both sides use are in
``storage_service.protocol.tls``."""
