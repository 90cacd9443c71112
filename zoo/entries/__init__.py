"""Zoo entries: one module per package (or family), each with a list ``ENTRIES``."""
