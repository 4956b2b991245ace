"""The request path of a node: the StorageNode, its gRPC service and server, the produce
port, request validation and the key-value calls."""
