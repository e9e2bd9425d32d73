"""Endpoint-picker mode: the router decides, an Envoy gateway carries the bytes (ext_proc)."""
