"""Every Prometheus metric of vdet, defined once (`registry.Metrics`), and what a result carries
to them across processes (`registry.ResultObservation`)."""
