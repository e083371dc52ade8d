"""migpart: dynamic MIG repartitioning for Kubernetes Dynamic Resource Allocation."""

__version__ = "0.1.0"

DRIVER_NAME = "mig.migpart.io"
API_GROUP = "migpart.io"
API_VERSION = "v1alpha1"
