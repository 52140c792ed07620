# syntax=docker/dockerfile:1
#
# The fencebridge container: `fencebridge run` with its configuration mounted at
# /etc/fencebridge and the database URL in FENCEBRIDGE_DATABASE_URL. Schema migrations are an
# operator's step (`fencebridge migrate`, the same image with another command), never run here.
#
# The base image is pinned by digest, so a rebuild starts from the same bytes (the tag is kept
# for readers; Docker resolves the digest). To move to a newer build of Python 3.11 on Debian
# bookworm, look up the multi-platform digest and replace it here:
#
#     docker buildx imagetools inspect python:3.11.14-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# -- build: the wheel, then a virtual environment with it and its dependencies -----------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge ./bridge
COPY consumers ./consumers

# Every dependency ships binary wheels for amd64 and arm64 (psycopg[binary], grpcio), so no
# compiler is installed, even here. The environment is made without pip of its own; the
# build stage's pip installs into it. EXTRAS names the optional parts installed with it: the
# OpenTelemetry instrumentations by default (they are wired only when traces are exported);
# `--build-arg EXTRAS=` leaves them out.
ARG EXTRAS=instrumentation
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv --without-pip /opt/fencebridge \
 && wheel="$(ls /dist/fencebridge-*.whl)" \
 && python -m pip --python /opt/fencebridge/bin/python install "${wheel}${EXTRAS:+[$EXTRAS]}"

# -- runtime: the environment on a clean base, as an unprivileged user --------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="fencebridge" \
      org.opencontainers.image.description="Broker deliveries become fenced work rows in PostgreSQL" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/fencebridge/bin:$PATH

# A fixed UID/GID, so Kubernetes can check runAsNonRoot and volumes can be granted to it.
RUN groupadd --system --gid 10001 fencebridge \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin fencebridge

COPY --from=build /opt/fencebridge /opt/fencebridge

USER 10001:10001

# /healthz and /readyz (health_port in the [bridge] table of the configuration; 8080 by default,
# and health_host must be 0.0.0.0 for anything outside the container to reach it).
EXPOSE 8080

# The probe uses the image's own Python: no curl in the image. urlopen raises on a refused
# connection or any status >= 400, and the uncaught exception exits 1 (unhealthy).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

# fencebridge runs as PID 1 (exec form) and handles SIGTERM itself: stop receiving, let
# in-flight work settle or lapse within the configured deadline, close the pool, exit. Give the
# container more time than that deadline (terminationGracePeriodSeconds, docker stop -t).
STOPSIGNAL SIGTERM

ENTRYPOINT ["fencebridge"]
CMD ["run", "--config", "/etc/fencebridge/bridge.toml"]
