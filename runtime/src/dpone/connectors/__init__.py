"""Data connectors: move one chunk (or, for a full refresh, every row) from a source to a sink in
one transaction.

The orchestrator imports only this package's surface; the dialect modules (and their drivers) load
on demand in :mod:`dpone.connectors.factory`. See docs/connectors.md.
"""

from dpone.connectors.base import (
    CHECKSUM_SCHEME,
    ChunkFence,
    ChunkWindow,
    ChunkWrite,
    RowChecksum,
    Sink,
    SinkOptions,
    SinkSpec,
    Source,
    SourceSpec,
    TableRef,
)
from dpone.connectors.factory import open_sink, open_source, table_checksum

__all__ = [
    "CHECKSUM_SCHEME",
    "ChunkFence",
    "ChunkWindow",
    "ChunkWrite",
    "RowChecksum",
    "Sink",
    "SinkOptions",
    "SinkSpec",
    "Source",
    "SourceSpec",
    "TableRef",
    "open_sink",
    "open_source",
    "table_checksum",
]
