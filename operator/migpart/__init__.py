"""migpart: dynamic MIG repartitioning for Kubernetes Dynamic Resource Allocation."""

import os

__version__ = "0.1.0"

REVISION_ENV = "MIGPART_REVISION"
"""Set by the image build (Dockerfile): the git commit the image was built from."""


def revision() -> str:
    """The source revision this build came from; `unknown` where it is not set (a checkout
    run from its virtualenv)."""
    return os.environ.get(REVISION_ENV) or "unknown"
