"""Plan -> act -> verify: ``clear`` and ``wait``."""
