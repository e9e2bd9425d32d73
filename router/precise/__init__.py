"""Precise mode: route on vLLM's own block hashes, matched against residency from KV events.

Modules, one job each (imported only when precise mode is configured, so the router's core
install needs neither ZMQ nor transformers):
- ``block_hash``: vLLM's sha256_cbor block-hash chain, recomputed outside vLLM;
- ``exact``: ``ExactResidency``, each worker's blocks stored and not removed;
- ``kv_events``: ``KVEventSubscriber``, one worker's ZMQ event stream into a sink;
- ``tokenize``: the prompt's token ids as vLLM computes them (chat template applied);
- ``feeds``: one subscriber per worker, started and stopped with the pool;
- ``matcher``: request -> (routing key, per-worker match, predicted cached tokens);
- ``collector``: their state as Prometheus metrics, read at scrape time;
- ``redis_sink``: the optional mirror of one worker's exact residency into Redis (written
  by prefix-worker, not read by routers).
"""
