"""`vdet bench serve`: a real `vdet serve`, driven and measured from the outside as users run it.

The package owns the benchmark client: starting and stopping the server process (`server`),
its streams and control calls over REST (`control`), WebSocket event clients in their own
processes (`events_client`), what the server process tree and the GPUs use (`proctree`,
`gpu_memory`), the server's own counters (`scrape`), one worker process killed mid-window
(`kill`), the bare pipeline and Ultralytics run beside it (`pipeline_baseline`,
`ultralytics_baseline`), the steps and variants of one run (`runner`) and the result file's
schema (`results`). It imports
nothing of the server: what it knows of vdet is the entry point, the settings names and the
HTTP/WebSocket API.
"""
