"""The streams: the seam everything else uses (`service.StreamService`: `StreamControl` for
changes, `StreamReads` for what they show), the manager of a process's streams and their threads
(`manager`), the service of streams that run in this process (`local`), a stream's parameters
(`params`), its pictures (`pictures`) and event snapshots (`event_snapshots`), and start-up and
the streams file (`startup`, `store`, `persistent`). It speaks no HTTP."""
