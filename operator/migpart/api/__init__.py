"""pydantic models of the migpart CRDs: the single source of truth for crds/*.yaml."""
