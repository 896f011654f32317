# syntax=docker/dockerfile:1.7
# pyepp Endpoint Picker image: `docker build -t pyepp:dev .` (see docs/deploy.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a venv with pyepp and its runtime dependencies (no compilers reach the final image) ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY epp ./epp
RUN pip install --no-compile . \
    && python -m compileall -q -j 0 /opt/venv/lib \
    && find /opt/venv -name '*.pyi' -delete

# ---- runtime: slim base, non-root, read-only-root friendly (caches go to /cache, an emptyDir in the chart) ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="pyepp" \
      org.opencontainers.image.description="Python Endpoint Picker for LLM inference behind Envoy ext_proc" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 epp \
    && useradd --system --uid 10001 --gid epp --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin epp \
    && mkdir -p /cache /config \
    && chown 10001:10001 /cache
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYEPP_CACHE=/cache/pyepp \
    HF_HOME=/cache/huggingface \
    XDG_CACHE_HOME=/cache
USER 10001:10001
# 9002 ext_proc gRPC, 9003 gRPC health, 9090 Prometheus metrics
EXPOSE 9002 9003 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "epp.healthcheck", "--port", "9003", "--service", "readiness"]
ENTRYPOINT ["epp"]
CMD ["serve", "--config-file=/config/default-plugins.yaml"]
