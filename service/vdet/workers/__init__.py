"""Stream worker processes: the streams of one `vdet serve` spread over several processes.

`plan` decides how many processes and on which GPU each runs; `pool` (the API process's side)
starts and supervises them, routes control calls to the one that owns a stream and feeds their
results into the results hub, reading their pipes through `inbox`; `child` is what runs inside
each worker; `channel` is the wire between the two; `mps` starts NVIDIA's MPS daemon for
workers that share a GPU.
See docs/workers.md.
"""
