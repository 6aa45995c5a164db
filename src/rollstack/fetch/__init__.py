"""The chunk data path of the lazy layer store (docs/lazy-store.md).

memory (`MemoryChunkCache`) -> node disk (`DiskChunkCache`) -> peers (`PeerClient`) -> registry,
orchestrated by `ChunkFetcher` (trio: single-flight, coalesced parallel range GETs, verified
chunks, deadlines); access traces (`TraceStore`) drive prefetch.
"""

from rollstack.fetch.config import FetchConfig
from rollstack.fetch.disk import DiskChunkCache
from rollstack.fetch.fetcher import ChunkFetcher
from rollstack.fetch.layer import RemoteLayer
from rollstack.fetch.memory import MemoryChunkCache
from rollstack.fetch.peers import PeerClient
from rollstack.fetch.stats import Account, FetchMetrics, Priority, Tier
from rollstack.fetch.traces import Trace, TraceChunk, TraceRecorder, TraceStore
from rollstack.format.ranges import RangeRequest, coalesce

ChunkCache = MemoryChunkCache

__all__ = [
    "Account", "ChunkCache", "ChunkFetcher", "DiskChunkCache", "FetchConfig", "FetchMetrics", "MemoryChunkCache",
    "PeerClient", "Priority", "RangeRequest", "RemoteLayer", "Tier", "Trace", "TraceChunk", "TraceRecorder", "TraceStore",
    "coalesce",
]
