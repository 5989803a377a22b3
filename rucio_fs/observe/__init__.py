"""Looking at live mounts: always-on counters and log2 latency histograms
(:mod:`.stats`), their rendering (:mod:`.report`, Prometheus in :mod:`.metrics`), kernel FUSE
tracing joined with the daemon's (:mod:`.tracing`), the control channel of a mount
(:mod:`.control`) and finding mounts (:mod:`.mounts`).

May import: the top-level modules only.
"""
