"""The ``rmq`` command line."""
