"""Every model of the built-in catalog fits the bounds that the CRDs put on a GPU.

`migpart.api.models` bounds a MigNode spec (instances per GPU, an instance's start, a profile
name) and a policy's profile lists, so that the CEL rules stay within the API server's cost
budget. A GPU model whose layouts exceed them could be planned but never written; these tests
fail when a catalog entry is added that does not fit. (`MAX_GPUS` bounds the GPUs of a node,
which the catalog does not know.)
"""

from __future__ import annotations

import pytest

from migpart.api.models import (
    MAX_INSTANCES_PER_GPU,
    MAX_PROFILES,
    GpuSpec,
    MigInstanceSpec,
    ProfileFilter,
)
from migpart.mig import CATALOG, enumerate_layouts


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_the_largest_layout_fits_a_gpu_spec(model: str) -> None:
    table = CATALOG[model]
    largest = max(enumerate_layouts(table, frozenset()), key=len)
    assert len(largest) <= MAX_INSTANCES_PER_GPU
    instances = [MigInstanceSpec(profile=i.profile, start=i.start) for i in sorted(largest)]
    GpuSpec(index=0, instances=instances)  # validates the length bound as the CRD states it


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_every_placement_fits_an_instance_spec(model: str) -> None:
    """Profile names match the spec's pattern and length, starts its bound."""
    for prof in CATALOG[model].profiles:
        for start in prof.placements:
            MigInstanceSpec(profile=prof.name, start=start)


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_a_policy_can_allow_every_profile(model: str) -> None:
    names = list(CATALOG[model].profile_names)
    assert len(names) <= MAX_PROFILES
    ProfileFilter(allow=names)
