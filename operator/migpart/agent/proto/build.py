"""Generate the Python gRPC modules (and mypy stubs) from the .proto files next to this one.

Run by `make proto`. The protos are compiled with the package root as include path, so the
generated `*_pb2_grpc.py` import `migpart.agent.proto.*_pb2` instead of a top-level module.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

PROTO_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PROTO_DIR.parents[2]  # operator/


def build() -> int:
    """Compile every .proto in this directory; return protoc's exit status."""
    protos = sorted(str(p.relative_to(SOURCE_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    # The mypy-protobuf plugins sit next to the interpreter; `make proto` does not put the
    # virtualenv on PATH.
    bindir = Path(sys.executable).parent
    plugins = [
        f"--plugin=protoc-gen-{name}={bindir / f'protoc-gen-{name}'}"
        for name in ("mypy", "mypy_grpc")
        if (bindir / f"protoc-gen-{name}").exists()
    ]
    args = [
        "grpc_tools.protoc",
        f"-I{SOURCE_ROOT}",
        f"-I{include}",
        *plugins,
        f"--python_out={SOURCE_ROOT}",
        f"--grpc_python_out={SOURCE_ROOT}",
        f"--mypy_out={SOURCE_ROOT}",
        f"--mypy_grpc_out={SOURCE_ROOT}",
        *protos,
    ]
    code: int = protoc.main(args)
    if code == 0:
        # The stubs are part of the checked package but are generated code: mypy reads their
        # types without judging their style (their `type: ignore`s vary with mypy versions).
        for stub in PROTO_DIR.glob("*_pb2*.pyi"):
            text = stub.read_text()
            if not text.startswith("# mypy: ignore-errors"):
                stub.write_text("# mypy: ignore-errors\n" + text)
    return code


if __name__ == "__main__":
    sys.exit(build())
