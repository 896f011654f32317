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
# Slimming (docs/deploy.md has the sizes): transformers is only used for tokenizers, so its ~400 model packages
# lose their model code (modeling_*, modular_*, convert_*, image/video/feature processors; `auto` stays whole):
# AutoTokenizer needs only configs and tokenizers. No tests, no pip/setuptools, no Xet downloader (the hub falls
# back to plain HTTP), no command-line extras of transformers/huggingface_hub (typer, rich, pygments, pydantic).
# No precompiled bytecode either (~100 MB): it is written once per pod under /cache (PYTHONPYCACHEPREFIX below).
# The import check fails the build if any of this ever cuts too deep.
RUN pip install --no-compile . \
    && pip install --no-compile --no-deps --force-reinstall \
         "opentelemetry-proto==$(python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')" \
    && pip uninstall -q -y hf-xet setuptools typer rich pygments shellingham markdown-it-py mdurl pydantic \
         pydantic-core annotated-types typing-inspection \
    && find /opt/venv/lib/python3.11/site-packages/transformers/models -type f ! -path '*/models/auto/*' \
         \( -name 'modeling_*.py' -o -name 'modular_*.py' -o -name 'convert_*.py' -o -name 'image_processing_*.py' \
            -o -name 'video_processing_*.py' -o -name 'feature_extraction_*.py' \) -delete \
    && find /opt/venv -depth -type d \( -name tests -o -name test \) -path '*/site-packages/*' -exec rm -rf {} + \
    && find /opt/venv -name '*.pyi' -delete \
    && python -c "from transformers import AutoTokenizer, PreTrainedTokenizerFast; \
from transformers.convert_slow_tokenizer import TikTokenConverter; \
from transformers.models.qwen2 import Qwen2TokenizerFast; import epp.cli, epp.server.runner, epp.server.tracing" \
    && pip uninstall -q -y pip \
    && find /opt/venv -depth -name __pycache__ -type d -exec rm -rf {} +

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
    PYTHONPYCACHEPREFIX=/cache/pycache \
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
