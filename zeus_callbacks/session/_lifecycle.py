"""The process's cleanup registry, re-exported: it lives in :mod:`zeus_callbacks._lifecycle`.

It moved to a top-level module so that parts below the session (the power-limit controller)
can register with the one SIGTERM / atexit registry without importing the session package.
"""

from zeus_callbacks._lifecycle import CLEANUPS, CleanupOrder, CleanupRegistry, Registration

__all__ = ["CLEANUPS", "CleanupOrder", "CleanupRegistry", "Registration"]
