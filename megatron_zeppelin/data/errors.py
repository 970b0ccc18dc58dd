"""The workloads' error, a leaf so that the readers workloads.py imports can raise it too."""

from megatron_zeppelin.errors import ZeppelinError


class WorkloadError(ZeppelinError):
    """A dataset preset or length file that cannot be used; names the flag to change."""
