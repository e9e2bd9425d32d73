"""Overload control before dispatch: a bounded, priority- and tenant-fair queue per model,
per-tenant limits, and 429 with a Retry-After from the predicted drain time."""
