"""NVML failures map onto the migpart error vocabulary the same way for every backend."""

from __future__ import annotations

import os

import pynvml
import pytest

from migpart.agent.backend import map_nvml_error
from migpart.errors import GpuBusy, NvmlFailure


@pytest.mark.parametrize(
    ("code", "kind", "name"),
    [
        (pynvml.NVML_ERROR_IN_USE, GpuBusy, "NVML_ERROR_IN_USE"),
        (
            pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
            NvmlFailure,
            "NVML_ERROR_INSUFFICIENT_RESOURCES",
        ),
        (pynvml.NVML_ERROR_NOT_FOUND, NvmlFailure, "NVML_ERROR_NOT_FOUND"),
        (pynvml.NVML_ERROR_NO_PERMISSION, NvmlFailure, "NVML_ERROR_NO_PERMISSION"),
    ],
)
def test_map_nvml_error(code: int, kind: type[Exception], name: str) -> None:
    err = map_nvml_error(pynvml.NVMLError(code), "create 1g.10gb@0 on GPU 0")
    assert type(err) is kind
    assert str(err).startswith(f"create 1g.10gb@0 on GPU 0: {name}")
    if isinstance(err, NvmlFailure):
        assert err.code == code


def test_real_nvml_error_classes_are_subclasses_with_codes() -> None:
    err = pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    assert type(err).__name__ == "NVMLError_InsufficientResources"
    assert err.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


if os.environ.get("MIGPART_GPU") != "1":

    async def test_real_backend_without_a_driver_fails_with_the_nvml_code() -> None:
        """On a machine without the NVIDIA driver, opening the real backend says so."""
        from migpart.agent.nvml import RealNvml

        with pytest.raises(NvmlFailure) as info:
            await RealNvml.open()
        assert info.value.code in (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        )
