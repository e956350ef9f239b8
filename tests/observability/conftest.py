"""Fixtures of the observability tests."""

from .runproject import project

__all__ = ["project"]
