"""`FetchConfig`: every knob of the chunk data path, as one explicit value object (pydantic:
it travels inside the lazy store daemon's one JSON config, lazystore/config.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FetchConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    memory_budget: int = 512 << 20
    """Bytes of decompressed chunks kept in the daemon's memory (LRU). 512 MiB (was 256): the
    swe-project image's cold start reads a 245 MB decompressed trace; at 256 MiB the LRU evicted
    chunks the command then read again (12-16 MB of demand fetches, 20-24 MB from disk, 343-441
    GETs); with room for it: 0 demand bytes, 58 GETs, daemon CPU 1.1 vs 1.8 s."""
    disk_budget: int = 8 << 30
    """Bytes of chunks kept in the node disk cache (LRU by last use)."""
    max_request: int = 4 << 20
    """Largest coalesced range GET (stored bytes)."""
    neighbor_bytes: int = 256 << 10
    """On a demand miss, also fetch the following chunks of the blob (in blob order, so the
    next files of the same directory) up to this many stored bytes, in the same request."""
    neighbor_back_bytes: int = 64 << 10
    """Also claim the chunks stored up to this many bytes *before* the missed one (the files of
    the same directory that sort earlier)."""
    fetch_on_open: bool = False
    """Start a file's first chunk (a demand miss, with neighbours) when it is opened rather than
    at its first read. Off: measured no gain (the open -> read gap is tiny next to a ~12 ms
    registry round trip; stall time unchanged)."""
    neighbor_same_dir: bool = False
    """Neighbour windows stop at the missed file's parent directory subtree (no bytes spent on
    the next directory in blob order)."""
    dir_prefetch_bytes: int = 0
    """On a registry miss in a directory this daemon has not prefetched yet, fetch the other
    small files of that directory (direct children, in blob order) up to this many stored bytes,
    in parallel requests beside the demand one. 0 = off, the default: measured slower on the cold
    import benchmark (1.13-1.21 s vs 1.00 s at 2 MiB: 35 more GETs, +6 MB, and their decoding
    competes with the importing program for the node's CPU; `bench fetch --only ablation`)."""
    dir_prefetch_file_max: int = 256 << 10
    """Files larger than this (stored bytes) are left out of a directory prefetch (shared
    libraries and data files are read partially, if at all)."""
    dir_prefetch_request: int = 256 << 10
    """Stored bytes per directory-prefetch request: small requests land (and unblock readers)
    sooner than one big one."""
    writeback_quiet: float = 0.2
    """Chunks fetched for demand reads and prefetch reach the disk cache once no foreground
    request has been in flight for this long: one file write per chunk (thousands in a cold
    start) would otherwise compete with the program that is waiting for them. 0 = at once."""
    writeback_max: int = 256 << 20
    """Bytes of fetched chunks that may wait for the disk at once; past it they are written now,
    by the fetching thread (on the critical path). 256 MiB (was 64): a big image's cold start
    (swe-project: a 245 MB decompressed trace) otherwise crossed it and wrote every later chunk
    synchronously during the command (3.8 s of its fetch threads' samples in file writes)."""
    prefetch_gap: int = 256 << 10
    """Prefetch (traces) plans range GETs across gaps of up to this many stored bytes (the gap
    is transferred and dropped): fewer requests for a trace's scattered small chunks. Measured
    (`bench fetch --only sharedtrace --runs 5`): 145 -> 68 GETs, 6.9 -> 9.5 MB, cold start with a
    shared trace 1.06 -> 0.69 s p50 (0 KiB vs 128 KiB, two runs back to back); 256 KiB with
    growing waves (`fetch.waves`): the python-project trace in 97 instead of 178 GETs."""
    multi_range_gap: int = 16 << 10
    """With multi-range GETs (`store.byteranges`), prefetch bridges only gaps up to this many
    stored bytes (a part costs ~100 bytes of headers, not a request)."""
    multi_range_spans: int = 64
    """Ranges per multi-range GET (at most `store.byteranges.MAX_SPANS`)."""
    readahead_bytes: int = 16 << 20
    """Sequential reads of one file prefetch this far ahead (stored bytes)."""
    foreground_requests: int = 8
    """Parallel registry requests for demand reads."""
    prefetch_requests: int = 8
    """Parallel registry requests for trace prefetch and readahead (was foreground - 2 = 6;
    8 measured faster on a 570-chunk trace, `fetch.waves`)."""
    background_requests: int = 1
    """Parallel registry requests for background fill (its bounded share of concurrency)."""
    background_request: int = 1 << 20
    """Background fill request size: small, so a demand read never queues behind much."""
    background_grace: float = 3.0
    """Seconds after `begin_env` before an environment's background fill starts (the
    environment's first command runs on an uncontended node)."""
    background_quiet: float = 0.5
    """Background requests start only this long after the last foreground request ended."""
    background_min_idle: float = 0.5
    """Background requests start only while this many cores were idle over the last 0.2 s
    (/proc/stat; `fetch.background`); 0 = no CPU condition."""
    link_rate: float = 125e6
    """The node's link to the registry, bytes/s (1 Gbit/s): the base of the background share."""
    background_share: float = 0.25
    """Fraction of `link_rate` background fill may use (token bucket); 0 = unlimited."""
    deadline: float = 30.0
    """Seconds a read may wait for the registry (retries included) before it fails with EIO."""
    retry_initial: float = 0.05
    """First retry backoff in seconds (doubles, capped at `retry_max`)."""
    retry_max: float = 2.0
    peer_timeout: float = 0.25
    """Seconds a peer may take (connect + answer) before we fall through to the registry."""
    peer_dead_for: float = 10.0
    """After a connection failure, skip that peer for this long."""
    trace_window: float = 30.0
    """An environment's reads during its first N seconds form its access trace."""
    trace_max_chunks: int = 20000
