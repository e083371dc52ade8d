"""Types every layer shares, defined once.

A leaf: it imports nothing of migpart, so the operator's modules (kube and controller alike)
and the agent's may all import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Body = Mapping[str, Any]
"""A Kubernetes object as the API server or a watch delivers it (read-only, plain JSON)."""
