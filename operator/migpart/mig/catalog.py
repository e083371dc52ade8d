"""The built-in catalog of MIG profile tables, keyed by NVML product name.

Tables read from NVML on the node (agent) or given in a snapshot always win over these; the
catalog serves offline planning (`migpart plan`) and the NVML simulator.

H100 80GB HBM3 and H200 are transcribed from real NVML dumps (tests/fixtures/nvml/, driver
580.159.04) and a test compares them field for field. The other models follow the public
"NVIDIA Multi-Instance GPU User Guide", section "Supported MIG Profiles" (profile names,
instance counts, placements, SM counts); their memory sizes are that guide's GiB figures in
MiB, which NVML on a real node replaces with the exact values.
"""

from __future__ import annotations

from migpart.errors import UnknownModel
from migpart.mig.profiles import ModelTable, Profile

# Columns, the fields of `Profile` in its order: name, compute slices, memory slices, starts,
# max instances, memory MiB, SMs, copy engines, decoders, encoders, jpegs, ofas, NVML profile
# index, NVML profile id
_Row = tuple[str, int, int, tuple[int, ...], int, int, int, int, int, int, int, int, int, int]

_ALL7 = (0, 1, 2, 3, 4, 5, 6)
_EVEN4 = (0, 2, 4, 6)
_EVEN3 = (0, 2, 4)


def _seven_slice_rows(
    mem: tuple[str, str, str, str],
    mib: tuple[int, int, int, int],
    sms: tuple[int, int, int, int, int, int],
) -> list[_Row]:
    """The Hopper/Ampere/Blackwell 7-compute x 8-memory-slice geometry with model sizes.

    `mem`: the GB suffixes of the 1-slice, 2-slice, 4-slice and 8-slice memory profiles;
    `mib`: their memory in MiB; `sms`: SMs of 1g, 1g(2 mem), 2g, 3g, 4g, 7g.
    """
    m1, m2, m4, m8 = mem
    b1, b2, b4, b8 = mib
    s1, s1x, s2, s3, s4, s7 = sms
    return [
        (f"1g.{m1}", 1, 1, _ALL7, 7, b1, s1, 1, 1, 0, 1, 0, 0, 19),
        (f"1g.{m1}+me", 1, 1, _ALL7, 1, b1, s1, 1, 1, 0, 1, 1, 7, 20),
        (f"1g.{m2}", 1, 2, _EVEN4, 4, b2, s1x, 1, 1, 0, 1, 0, 9, 15),
        (f"2g.{m2}", 2, 2, _EVEN3, 3, b2, s2, 2, 2, 0, 2, 0, 1, 14),
        (f"3g.{m4}", 3, 4, (0, 4), 2, b4, s3, 3, 3, 0, 3, 0, 2, 9),
        (f"4g.{m4}", 4, 4, (0,), 1, b4, s4, 4, 4, 0, 4, 0, 3, 5),
        (f"7g.{m8}", 7, 8, (0,), 1, b8, s7, 8, 7, 0, 7, 1, 4, 0),
    ]


def _table(
    model: str, compute: int, memory: int, rows: list[_Row], pci: tuple[int, ...]
) -> ModelTable:
    profiles = tuple(Profile(*row) for row in rows)
    return ModelTable(
        model=model,
        compute_slices=compute,
        memory_slices=memory,
        profiles=profiles,
        pci_device_ids=pci,
    )


_H100_80GB = _seven_slice_rows(
    ("10gb", "20gb", "40gb", "80gb"), (9984, 20096, 40448, 81152), (16, 26, 32, 60, 64, 132)
)
_H200 = _seven_slice_rows(
    ("18gb", "35gb", "71gb", "141gb"), (16384, 33280, 71424, 143360), (16, 26, 32, 60, 64, 132)
)
# MIG User Guide, "H100 MIG Profiles" (H100 NVL, 94 GB): 1g.12gb, 1g.24gb, 2g.24gb, 3g.47gb,
# 4g.47gb, 7g.94gb with the H100 SM counts.
_H100_94GB = _seven_slice_rows(
    ("12gb", "24gb", "47gb", "94gb"), (11264, 23552, 47616, 95232), (16, 26, 32, 60, 64, 132)
)
# MIG User Guide, "A100 MIG Profiles": A100 80GB offers 1g.10gb ... 7g.80gb, 14 SMs per slice.
_A100_80GB = _seven_slice_rows(
    ("10gb", "20gb", "40gb", "80gb"), (9728, 19968, 40192, 80384), (14, 14, 28, 42, 56, 98)
)
# MIG User Guide, "A100 MIG Profiles": A100 40GB offers 1g.5gb ... 7g.40gb.
_A100_40GB = _seven_slice_rows(
    ("5gb", "10gb", "20gb", "40gb"), (4864, 9856, 19968, 40192), (14, 14, 28, 42, 56, 98)
)
# MIG User Guide, "B200 MIG Profiles": 1g.23gb, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb.
_B200 = _seven_slice_rows(
    ("23gb", "45gb", "90gb", "180gb"), (23552, 46080, 92160, 184320), (18, 18, 36, 54, 72, 144)
)
# MIG User Guide, "A30 MIG Profiles": 4 compute x 4 memory slices; 1g.6gb, 2g.12gb, 4g.24gb and
# the media-extension variants.
_A30: list[_Row] = [
    ("1g.6gb", 1, 1, (0, 1, 2, 3), 4, 5888, 14, 1, 1, 0, 1, 0, 0, 14),
    ("1g.6gb+me", 1, 1, (0, 1, 2, 3), 1, 5888, 14, 1, 1, 0, 1, 1, 7, 21),
    ("2g.12gb", 2, 2, (0, 2), 2, 12032, 28, 2, 2, 0, 2, 0, 1, 5),
    ("2g.12gb+me", 2, 2, (0, 2), 1, 12032, 28, 2, 2, 0, 2, 1, 8, 6),
    ("4g.24gb", 4, 4, (0,), 1, 24320, 56, 4, 4, 0, 4, 1, 3, 0),
]

# The last column: PCI device ids (vendor 0x10DE), as mig-parted's `device-filter` names them
# (0x233010DE is device 0x2330 of vendor 0x10DE). From the PCI ID Repository (pci.ids) where it
# names the board, else from the comments of the GPU Operator's default mig-parted config
# (H200 0x2335, H100 NVL 0x2321, B200 0x2901).
CATALOG: dict[str, ModelTable] = {
    t.model: t
    for t in (
        _table("NVIDIA H100 80GB HBM3", 7, 8, _H100_80GB, (0x2330,)),
        _table("NVIDIA H200", 7, 8, _H200, (0x2335,)),
        _table("NVIDIA H100 NVL", 7, 8, _H100_94GB, (0x2321,)),
        _table("NVIDIA A100-SXM4-80GB", 7, 8, _A100_80GB, (0x20B2,)),
        _table("NVIDIA A100 80GB PCIe", 7, 8, _A100_80GB, (0x20B5,)),
        _table("NVIDIA A100-SXM4-40GB", 7, 8, _A100_40GB, (0x20B0,)),
        _table("NVIDIA A100-PCIE-40GB", 7, 8, _A100_40GB, (0x20B1, 0x20F1)),
        _table("NVIDIA B200", 7, 8, _B200, (0x2901,)),
        _table("NVIDIA A30", 4, 4, _A30, (0x20B7,)),
    )
}


def builtin_table(model: str) -> ModelTable | None:
    return CATALOG.get(model)


def lookup_table(
    model: str, supplied: dict[str, ModelTable] | None = None, path: str = "model"
) -> ModelTable:
    """The table for `model`: a supplied one wins over the catalog."""
    if supplied and model in supplied:
        return supplied[model]
    table = CATALOG.get(model)
    if table is None:
        raise UnknownModel(path, f"unknown model {model!r} and no profile table given")
    return table
