"""Sources to frames: which URLs and files may be sources (`urls`), PyAV demux and decode
(`reader`), NVDEC (`nvdec`, `nvdec_reader`), the supervised thread of each source with its
reconnects and watchdog (`source_thread`), the newest-frame mailbox (`mailbox`) and which frames
a stream's `detect_fps` detects (`sampling`). It runs no model."""
