"""Results on their way out: the hub that numbers every result with one seq and keeps the replay
ring (`hub`), and a result's JSON, encoded once by whoever makes it (`wire`)."""
