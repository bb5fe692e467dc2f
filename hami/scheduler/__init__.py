"""The scheduler role: cluster state from watches, handshake, extender, webhook, metrics."""
