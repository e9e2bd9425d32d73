"""Which worker holds which prefix blocks warm: one interface, an in-memory and a Redis store."""
