# syntax=docker/dockerfile:1
# migpart image: `migpart operator` (Deployment) and `migpart agent` (DaemonSet) from one image.
#
#   docker build -t migpart:0.1.0 .
#
# Stage 1 generates the kubelet gRPC code (not committed, see operator/migpart/agent/proto) and
# builds wheels of migpart and all its dependencies; stage 2 installs them without a compiler
# and without network access to an index. Python 3.11 is the interpreter the tests run on.

ARG PYTHON_IMAGE=python:3.11.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The code generator: grpcio-tools (protoc) and mypy-protobuf (the build script also writes .pyi
# stubs, which need protoc-gen-mypy next to the interpreter). Bounds as in pyproject.toml.
RUN pip install "grpcio-tools>=1.62,<2" "mypy-protobuf>=3.6" "protobuf>=5.26,<7"
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN PYTHONPATH=operator python -m migpart.agent.proto.build \
 && ls operator/migpart/agent/proto/*_pb2_grpc.py
# Generated code checks at import time that the runtime's grpcio and protobuf are at least the
# generator's: pin the runtime to exactly the versions that generated it.
RUN pip freeze | grep -iE '^(grpcio|protobuf)==' > /tmp/constraints.txt \
 && cat /tmp/constraints.txt \
 && pip wheel --wheel-dir /wheels --constraint /tmp/constraints.txt .

FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-index --find-links /wheels migpart \
 && rm -rf /wheels \
 && python -c "import migpart.agent.plugin, migpart.controller.handlers" \
 && groupadd --system --gid 65532 migpart \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin migpart
# Non-root by default (the operator); the agent DaemonSet runs this image as root, privileged,
# because NVML needs that to create and destroy MIG instances.
USER 65532:65532
ENTRYPOINT ["migpart"]
CMD ["--help"]
