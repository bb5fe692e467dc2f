"""Thin Kubernetes I/O shells: client, raw JSON requests, patches, list+watch, events."""
