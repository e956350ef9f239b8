"""Data connectors: move one chunk (or, for a full refresh, every row) from a source to a sink in
one transaction.

The orchestrator imports only this package's surface; the dialect modules (and their drivers) load
on demand in :mod:`dpone.connectors.factory`. See docs/connectors.md.
"""

from dpone.connectors import base
from dpone.connectors.base import *  # noqa: F403 - the contract, as base.__all__ names it
from dpone.connectors.factory import open_sink, open_source, pair_checksums, table_checksum

__all__ = ["open_sink", "open_source", "pair_checksums", "table_checksum"]
__all__ += base.__all__
