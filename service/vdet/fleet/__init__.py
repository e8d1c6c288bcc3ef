"""A fleet of vdet nodes on NATS JetStream: one desired state, streams placed on nodes by leases.

- `placement`: which unowned streams a node claims (pure: the same view gives every node the
  same plan).
- `store`: the JetStream key-value buckets (desired streams, owner leases, live nodes) and
  their compare-and-set writes.
- `view`: a node's mirror of the three buckets, kept by watchers.
- `node`: one node's loop: heartbeat, claim, renew, run what it owns through a `StreamControl`,
  stop what it can no longer renew, hand off when it shuts down.

docs/fleet.md says how placement and failover work and what each failure costs.
"""
