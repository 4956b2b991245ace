"""Security tooling of the nodes: a cluster's certificates (certs.py). The TLS settings
both sides use are in ``storage_service.protocol.tls``."""
