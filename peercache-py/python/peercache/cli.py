"""Console scripts: the node binaries, run by the Rust core in this process."""

import sys

from . import _peercache


def node() -> None:
    _peercache.run_node(["peercache-node", *sys.argv[1:]])


def meta() -> None:
    _peercache.run_meta(["peercache-meta", *sys.argv[1:]])


def storage_server() -> None:
    _peercache.run_storage_server(["peercache-storage-server", *sys.argv[1:]])
