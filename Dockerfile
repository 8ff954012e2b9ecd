# The application image: gateway, executor worker, grader worker and the replay model, one image.
# Online: `docker build .`. Offline (no registry, no PyPI in the build): `make images` stages a wheelhouse
# under staged/ and passes a locally made Debian base image as BASE_IMAGE.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; fi \
 && python3 -m venv /opt/venv
COPY requirements-app.txt /tmp/requirements-app.txt
COPY staged/ /tmp/staged/
RUN set -e; \
    source=""; if ls /tmp/staged/wheels/*.whl >/dev/null 2>&1; then source="--no-index --find-links /tmp/staged/wheels"; fi; \
    /opt/venv/bin/pip install $source -r /tmp/requirements-app.txt

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH PYTHONPATH=/app
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*; fi \
 && useradd --uid 10001 --create-home --shell /usr/sbin/nologin pbe
COPY --from=build /opt/venv /opt/venv
COPY services /app/services
COPY gateway /app/gateway
COPY executor /app/executor
COPY grader /app/grader
COPY replay /app/replay
WORKDIR /app
# The gateway, the grader and the replay model run as the unprivileged user; the executor worker runs as
# root in its container only because it needs the Docker socket (compose sets `user:` per service).
USER pbe
# The build the manifests name (make images passes the project's version and commit); last, so a new commit
# rebuilds nothing but this.
ARG BUILD_VERSION=unknown
ARG BUILD_COMMIT=unknown
ENV PBE_SERVICE_VERSION=${BUILD_VERSION}+${BUILD_COMMIT}
CMD ["uvicorn", "--factory", "gateway.app:create_app", "--host", "0.0.0.0", "--port", "8080"]
