# migpart image: `migpart operator` (Deployment) and `migpart agent` (DaemonSet) from one image.
#
#   make image      buildah, on a Python base made here from Debian packages: no registry needed
#                   (hack/image/build.sh; docs/deploy.md, "Building it: `make image`")
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm@sha256:DIGEST \
#                --build-arg BUILD_IMAGE=python:3.11-slim-bookworm@sha256:DIGEST .
#
# The build stage installs the runtime dependencies from requirements/runtime.txt (pinned, every
# file's hash checked) into a virtualenv made without pip at /opt/migpart, generates the kubelet
# gRPC code with the grpcio-tools of requirements/build.txt (same grpcio and protobuf as the
# runtime) and adds migpart's own wheel. The runtime stage copies only that virtualenv: no pip,
# setuptools, wheel or compiler, no wheel files left in a layer.

# Made by hack/image/build.sh from Debian bookworm with mmdebstrap (never pulled). A pulled base
# must be pinned by digest (tests/unit/test_image.py checks the defaults).
ARG BASE_IMAGE=localhost/migpart-base:runtime
ARG BUILD_IMAGE=localhost/migpart-base:build

FROM ${BUILD_IMAGE} AS build
# File times and .pyc files (checked-hash when SOURCE_DATE_EPOCH is set) do not depend on when
# the image was built.
ARG SOURCE_DATE_EPOCH=0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH}
WORKDIR /src
COPY requirements/ requirements/
# A CA bundle for a TLS-intercepting proxy may come in as the optional secret `pip-ca`; it is
# mounted for this step only and never stored in a layer.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -m venv /opt/tools \
 && /opt/tools/bin/pip install --require-hashes --no-deps --only-binary=:all: \
      -r requirements/build.txt \
 && python3 -m venv --without-pip /opt/migpart \
 && /opt/tools/bin/pip --python /opt/migpart/bin/python install --require-hashes --no-deps \
      --only-binary=:all: -r requirements/runtime.txt
COPY pyproject.toml README.md LICENSE ./
COPY operator/ operator/
RUN PYTHONPATH=operator /opt/tools/bin/python -m migpart.agent.proto.build \
 && /opt/tools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheel . \
 && /opt/tools/bin/pip --python /opt/migpart/bin/python install --no-deps /tmp/wheel/migpart-*.whl \
 && /opt/tools/bin/pip --python /opt/migpart/bin/python check \
 && /opt/migpart/bin/python -c "import migpart.agent.plugin, migpart.controller.runtime.handlers"

FROM ${BASE_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
ARG CREATED=
LABEL org.opencontainers.image.title="migpart" \
      org.opencontainers.image.description="Kubernetes operator that repartitions NVIDIA MIG GPUs on demand for DRA ResourceClaims" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.created="${CREATED}"
# MIGPART_REVISION: what `migpart --version` prints beside the package version.
ENV PATH=/opt/migpart/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MIGPART_REVISION=${REVISION}
COPY --from=build /opt/migpart /opt/migpart
RUN echo 'migpart:x:65532:65532:migpart:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'migpart:x:65532:' >> /etc/group \
 && migpart --version
# Non-root by default (the operator); the agent DaemonSet runs this image as root, privileged,
# because NVML needs that to create and destroy MIG instances.
USER 65532:65532
ENTRYPOINT ["migpart"]
CMD ["--help"]
