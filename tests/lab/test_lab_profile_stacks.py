"""bench/profile_stacks.py on py-spy's collapsed stacks of a server and its workers."""

from __future__ import annotations

from support.lab import load_script

profile = load_script("profile_stacks.py")

SERVER = 'process 10:"/tmp/venv/bin/python /tmp/venv/bin/vdet serve --config c.yaml"'
# A spawned worker's command line holds ';'.
WORKER = 'process 11:"/tmp/venv/bin/python -c from multiprocessing.spawn import spawn_main; s()"'
LINES = [
    f"{SERVER};main (vdet/cli/serve.py:10);Hub.publish (/s/vdet/results/hub.py:40) 30\n",
    f"{SERVER};{WORKER};run (/s/vdet/streams/reader.py:5);decode (/s/nvc/__init__.py:9) 50\n",
    f"{SERVER};{WORKER};run (/s/vdet/streams/reader.py:5);_next (/s/vdet/ingest/demux.py:7) 20\n",
    "a line that is not a stack\n",
]


def test_samples_by_role_and_innermost_vdet_function() -> None:
    stacks = profile.parse(LINES)
    assert [s.role for s in stacks] == ["api", "worker", "worker"]
    text = profile.report(stacks, top=5)
    assert "samples: 100" in text
    assert "70.0%       70  worker" in text
    # decode() is PyNvVideoCodec's: its time counts for the vdet caller, and as its own leaf.
    assert "71.4%       50  run (vdet/streams/reader.py)" in text
    assert "71.4%       50  decode (__init__.py)" in text
    assert "28.6%       20  _next (vdet/ingest/demux.py)" in text
