"""PlanError: a plan that breaks the contract or does not match the data it is used with.

Its own module so that the Plan (types.py) and its metadata (meta.py), which types.py imports, can
both raise it; types.py re-exports it, where most code imports it from.
"""

from __future__ import annotations

from megatron_zeppelin.errors import ZeppelinError


class PlanError(ZeppelinError):
    """A plan that breaks the contract or does not match the data it is used with."""
