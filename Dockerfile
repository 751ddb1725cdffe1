# syntax=docker/dockerfile:1
# ntfy-intake image: multi-stage, non-root, state on the /data volume. python:3.11-slim is a
# multi-arch image (amd64 and arm64, so it runs on a Raspberry Pi 5 as is).

# ---- builder: resolve exactly what uv.lock says into a virtualenv at /opt/venv -------------
FROM python:3.11-slim AS builder
ENV UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir uv==0.13.9
WORKDIR /src
# Dependencies first, so a source change does not re-resolve them.
COPY pyproject.toml uv.lock ./
RUN uv sync --locked --no-dev --extra postgres --no-install-project
COPY README.md ./
COPY src ./src
RUN uv sync --locked --no-dev --extra postgres --no-editable

# ---- runtime ----------------------------------------------------------------------------------
FROM python:3.11-slim AS runtime
# A fixed uid/gid, so a bind-mounted /data or secret file can be chowned to it (docs/install.md).
RUN groupadd --system --gid 10001 ntfy-intake \
 && useradd --system --uid 10001 --gid ntfy-intake --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin ntfy-intake \
 && mkdir -p /data /etc/ntfy-intake \
 && chown ntfy-intake:ntfy-intake /data \
 && chmod 0700 /data
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NTFY_INTAKE_STATE_DIR=/data \
    NTFY_INTAKE_CONFIG=/etc/ntfy-intake/config.toml
# intake.sqlite3 and audit/ live here; a new named volume inherits the 0700 ntfy-intake owner.
VOLUME /data
USER 10001:10001
WORKDIR /data
# Loopback HTTP surface (feed, notify, /metrics, /healthz); publish it only with a token set.
EXPOSE 8788
# `check` exits 0 when the daemon's heartbeat is fresh, 1 otherwise. start-period covers local
# recovery (database open, audit replay) before the first heartbeat.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["ntfy-intake", "check"]
# SIGTERM (docker stop) starts the graceful drain; give it time with `stop_grace_period`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["ntfy-intake"]
CMD ["run", "--config", "/etc/ntfy-intake/config.toml"]
