# Phalanx's image, for those who build with Docker (or buildah, podman):
#   docker build -t phalanx.local/phalanx:0.1.0 .
# deploy/image/build.sh builds the same layout (/opt/phalanx venv, user 65532, same entrypoint)
# with no registry base image at all: a Debian base from mmdebstrap, committed by buildah.
#
# BASE: any Debian-like image with Python 3.11+ and its venv module.
# PIP_OPTS: extra pip options; to build offline from a wheelhouse in the context, e.g.
#   --build-arg PIP_OPTS="--no-index --find-links /src"   (with the wheels in ./wheels)
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG PIP_OPTS=""
# wheel[s]: ./wheels is optional; its files land in /src
# [node]: the node agents' extras; not [report] (matplotlib, only `phalanx simulate`'s plots)
COPY pyproject.toml README.md wheel[s] /src/
COPY src /src/src
RUN python3 -m venv /opt/phalanx \
 && /opt/phalanx/bin/pip install --no-cache-dir ${PIP_OPTS} "/src[node]" \
 && /opt/phalanx/bin/pip uninstall --yes pip setuptools wheel

FROM ${BASE}
COPY --from=build /opt/phalanx /opt/phalanx
RUN groupadd --gid 65532 phalanx \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx
ENV PATH=/opt/phalanx/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["/opt/phalanx/bin/phalanx"]
CMD ["scheduler", "--in-cluster"]
