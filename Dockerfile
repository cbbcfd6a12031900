# The spillgate gateway: `docker build -t spillgate .`, then
#   docker run -p 8080:8080 -v $PWD/my.yaml:/etc/spillgate/config.yaml:ro spillgate
# The same image runs the simulators: `--entrypoint spillgate spillgate sim-replica --host 0.0.0.0 --port 30000`.
# See docs/deploying.md.

# Builder: the wheel of this repository, installed with its dependencies into a virtual environment. Every
# dependency has binary wheels for this Python, so no compiler is needed here either.
FROM python:3.12-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway/ gateway/
COPY policies/ policies/
COPY backends/ backends/
COPY cache/ cache/
COPY config/ config/

RUN python -m venv /opt/spillgate \
    && /opt/spillgate/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && /opt/spillgate/bin/pip install /tmp/wheels/spillgate-*.whl \
    && /opt/spillgate/bin/spillgate serve --help > /dev/null

# Final: the same Python, the virtual environment and nothing else (no pip cache, no sources, no compiler).
FROM python:3.12-slim-bookworm

# XDG_STATE_HOME: where the ledger and config history go when the config sets no state.data_dir
# (/var/lib/spillgate/<config>-<digest>); mount a volume there, or set state.data_dir to one.
ENV PATH=/opt/spillgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_STATE_HOME=/var/lib

RUN groupadd --system --gid 10001 spillgate \
    && useradd --system --uid 10001 --gid spillgate --home-dir /var/lib/spillgate --no-create-home \
       --shell /usr/sbin/nologin spillgate \
    && mkdir -p /etc/spillgate /var/lib/spillgate \
    && chown spillgate:spillgate /var/lib/spillgate

COPY --from=builder /opt/spillgate /opt/spillgate

USER 10001:10001
WORKDIR /var/lib/spillgate
VOLUME ["/var/lib/spillgate"]
EXPOSE 8080

# /health answers while the process serves; urllib raises on a refused connection or an error status.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"]

# --port is the CMD so that `docker run IMAGE --port 9000` can move it; the default matches EXPOSE and the
# health check whatever listen.port the mounted config says.
ENTRYPOINT ["spillgate", "serve", "--host", "0.0.0.0", "--config", "/etc/spillgate/config.yaml"]
CMD ["--port", "8080"]
