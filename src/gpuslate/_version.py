"""gpuslate's version, in a module of its own: a package that the top-level ``gpuslate`` imports
(``remote``, for ``RemoteHost``) can read it without importing ``gpuslate`` back (no package loop)."""

__version__ = "0.1.0"
