# The draftgate image: `docker build -t draftgate .`. One image runs every draftgate process
# of the compose stack: the gateway (default command), `draftgate db upgrade`, `draftgate sim`
# and `draftgate dashboard`.
#
# Build stage: wheels for the project and its dependencies, so the final image has no
# compilers, no pip cache and no source tree. Only what the package is built from is copied,
# so an edit to tests or docs does not rebuild the wheels.
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY planner planner
COPY backends backends
COPY dashboard dashboard
COPY migrations migrations
# With the `otel` extra, so DRAFTGATE_TRACING=true works in the image (docs/tracing.md).
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[otel]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'draftgate[otel]' \
    && rm -rf /wheels \
    && useradd --system --create-home --home-dir /home/draftgate --uid 10001 draftgate \
    && mkdir -p /var/lib/draftgate \
    && chown draftgate:draftgate /var/lib/draftgate
USER draftgate
# The default SQLite file (DRAFTGATE_DATABASE_URL unset) lands in a directory the user owns;
# compose points DRAFTGATE_DATABASE_URL at PostgreSQL instead.
WORKDIR /var/lib/draftgate
EXPOSE 8080
# The gateway's liveness; compose gives the other commands (sim, dashboard) checks of their own.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('DRAFTGATE_PORT', '8080') + '/health', timeout=3)"]
CMD ["draftgate", "gateway", "--host", "0.0.0.0"]
