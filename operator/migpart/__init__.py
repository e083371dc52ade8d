"""migpart: dynamic MIG repartitioning for Kubernetes Dynamic Resource Allocation."""

__version__ = "0.1.0"
