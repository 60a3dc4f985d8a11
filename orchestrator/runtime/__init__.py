"""The runtime: Ray glue of the control plane (scheduler, poller, controllers, workers)."""
