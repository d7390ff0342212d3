"""The process's cleanup registry, re-exported: it lives in :mod:`zeus_callbacks.lifecycle`.

It moved to a top-level module so that parts below the session (the power-limit controller)
can register with the one SIGTERM / atexit registry without importing the session package.
"""

from zeus_callbacks.lifecycle import CLEANUPS, CleanupOrder, CleanupRegistry, Registration

__all__ = ["CLEANUPS", "CleanupOrder", "CleanupRegistry", "Registration"]
