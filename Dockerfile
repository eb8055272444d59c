# devplug's image: the core and every driver, installed from their wheels (not the test kit), running `devplug run`.
#
#   docker build -t devplug:0.1.0 .          (or buildah bud, kaniko: any builder of Dockerfiles; the DaemonSet of
#                                            deploy/ runs devplug:0.1.0)
#
# For amd64 and arm64 alike (python:3.11-slim-bookworm has both; pip takes each platform's binary wheels), with the
# OCI labels make image sets, and an SBOM attached by BuildKit:
#
#   docker buildx build --platform linux/amd64,linux/arm64 --sbom=true \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(git log -1 --format=%cI)" --build-arg SOURCE=https://... -t REGISTRY/devplug:0.1.0 .
#
# Without a Docker engine, `make image` builds the same layout from Debian's packages (tools/image/build.sh).
# The DaemonSet (deploy/) mounts the config at /etc/devplug/config.toml.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# 1. The wheels, built from this tree as `make dist` builds them (PEP 517: each sdist, then its wheel), and the list
#    of what the image installs from them (tools/image/contents.py: the core with every extra for users, such as
#    prometheus-client for [metrics], and every driver), as `make image` installs it.
FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY . .
RUN python -m pip install --no-cache-dir "build==1.2.2" \
    && python -m build --outdir /dist . \
    && python -m build --outdir /dist testkit \
    && for driver in drivers/*/; do python -m build --outdir /dist "$driver"; done \
    && python tools/image/contents.py requirements /dist --prefix /wheels > /dist/requirements.txt

# 2. A virtual environment with the wheels and their dependencies (binary wheels: nothing is compiled). Until
#    devplug 1.0 the core depends on its test kit (devplug-testing, built in stage 1 and found there, never on an
#    index): installed with it, then removed, as make image does (tools/image/contents.py removed).
FROM ${PYTHON_IMAGE} AS install
COPY --from=wheels /dist/ /wheels/
RUN python -m venv --without-pip /opt/devplug \
    && python -m pip --python /opt/devplug/bin/python install --no-cache-dir --only-binary=:all: \
        --find-links /wheels --requirement /wheels/requirements.txt \
    && python -m pip --python /opt/devplug/bin/python uninstall --yes devplug-testing

# 3. The runtime: the base image and the environment alone; no wheels, no build tools, no pip cache. The labels are
#    make image's (tools/image/metadata.py): the version, the commit and its time, and where the source is, given
#    as build arguments (empty when not given).
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="devplug" \
      org.opencontainers.image.description="Kubernetes device plugins with the whole device lifecycle" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=install /opt/devplug /opt/devplug
ENV PATH=/opt/devplug/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Root: the daemon creates its sockets in the kubelet's root-owned device-plugins folder (see deploy/).
ENTRYPOINT ["devplug"]
CMD ["run", "--config", "/etc/devplug/config.toml"]
