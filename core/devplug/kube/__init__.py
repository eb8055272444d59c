"""Kubernetes' rules and the way to its API server: resource and object names, identifiers checked before use, the
client the DRA front end and node profiles share."""
