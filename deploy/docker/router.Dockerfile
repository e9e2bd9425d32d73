# syntax=docker/dockerfile:1
# Router image: the gateway only (no engine, no LMCache, no torch): ~150 MB.
# Build from the repository root:
#   docker build -f deploy/docker/router.Dockerfile -t ghcr.io/prefix-router/router:0.1.0 .
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY . .
# Install into a prefix we can copy whole: the runtime stage gets no pip cache, no sources.
# The epp extra (grpcio) lets the same image run `prefix-router epp` (the chart's epp mode).
RUN pip install --no-cache-dir --prefix=/install '.[epp]' \
 && python -m compileall -q /install

FROM python:${PYTHON_VERSION}-slim
COPY --from=build /install /usr/local
# Non-root, matching the chart's runAsUser; the chart also mounts a read-only root.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin router
USER 10001:10001
# A container must listen on all interfaces (the router's own default is 127.0.0.1);
# the hash seed matches the workers'. Every other setting is a PREFIX_ROUTER_* env var.
ENV PREFIX_ROUTER_HOST=0.0.0.0 \
    PREFIX_ROUTER_PORT=8000 \
    PYTHONHASHSEED=0 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
CMD ["prefix-router", "serve"]
