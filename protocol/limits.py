"""Protocol-wide constants and defaults, each defined once: the SDK, the
nodes, the relays and the configuration all take them from here."""

from __future__ import annotations

GUID_LENGTH = 16                              # bytes; made by the SDK (BlazingMQ's size)
# A consumer's flow control when it sets none (BlazingMQ's defaults); a domain
# may set its own (`max_unconfirmed_*_default`).
MAX_UNCONFIRMED_MESSAGES = 1000
MAX_UNCONFIRMED_BYTES = 32 * 1024 * 1024
CONSUMER_PRIORITY_MAX = 2**30                 # priorities lie in [-2^30, 2^30]
PUT_FRAME_MESSAGES_MAX = 1000                 # PUTs per frame a hop builds when it resends
CONFIRM_FRAME_MESSAGES_MAX = 100_000          # seqs one ConfirmColumns may name (the SDK splits)
# Fewer PUTs to one queue in one SDK batch go as PutMessages (in one PutBatch
# with other queues' few): a columnar frame's fixed cost (Arrow IPC both
# ways, the vectorised checks, a run in the express lane) is paid per frame.
PUT_COLUMNS_MIN = 8
PUT_SPANNING_MIN = 32          # PUTs to several queues of one partition share a frame from this many (BatchPolicy)
DEDUP_HISTORY_WINDOW_MS = 300_000             # BlazingMQ's deduplicationTimeMs
# One producer's retransmission buffer (the SDK); a hop's holds many producers'
# (`protocol.retransmit.RetransmissionLimits`).
SESSION_MAX_PENDING_PUTS = 100_000
# A producer timestamp (`put_time_us`, microseconds since 1970) must lie where
# every engine reading the tables can hold it: Parquet readers that use
# nanoseconds (pyarrow with INT96, pandas) stop at 2262-04-11. 0 means unset.
PUT_TIME_US_MAX = (2**63 - 1) // 1000

# Liveness of a link, seen from its client (the SDK, a proxy's or a node's
# upstream): a heartbeat goes up every HEARTBEAT_INTERVAL_MS and the server
# echoes it; a client that has heard nothing at all for PEER_SILENCE_MAX_MS
# leaves the link for its next host. gRPC's keepalive pings alone missed a
# frozen peer now and then: queued behind data the peer no longer reads,
# the ping was never written, so its timeout never started.
HEARTBEAT_INTERVAL_MS = 1_000
PEER_SILENCE_MAX_MS = 3_000
