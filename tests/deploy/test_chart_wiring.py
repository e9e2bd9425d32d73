"""The chart wires routers, workers, Redis and LMCache consistently, not just validly."""

from __future__ import annotations

import helm_python as helm
import pytest
import yaml

from tests.deploy import chart as c

FULL = f"{c.RELEASE}-prefix-router"


def _router(objs):
    deploy = c.one(objs, "Deployment", f"{FULL}-router")
    return deploy, c.containers(deploy)[0]


def _workers(objs):
    return [s for s in c.find(objs, "StatefulSet") if "-worker-" in s["metadata"]["name"]]


def _worker_container(sts):
    return next(x for x in c.containers(sts) if x["name"] == "worker")


def _arg(args, flag):
    return args[args.index(flag) + 1]


def _lmcache_cm(objs, sts):
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    cm_name = next(v["configMap"]["name"] for v in volumes if v["name"] == "lmcache-config")
    cm = c.one(objs, "ConfigMap", cm_name)
    (key, text), = cm["data"].items()
    return key, yaml.safe_load(text)


def test_router_and_workers_share_one_redis_url():
    for values in ({}, c.example_values("multi-node.yaml"),
                   c.example_values("single-gpu-node.yaml")):
        objs = c.objects(values)
        _, router = _router(objs)
        url = c.env(router)["PREFIX_ROUTER_REDIS_URL"]
        assert url
        assert c.env(router)["PREFIX_ROUTER_DISCOVER"] == "true"
        workers = _workers(objs)
        assert workers
        for sts in workers:
            w = _worker_container(sts)
            assert c.env(w)["PREFIX_ROUTER_REDIS_URL"] == url
            # the registration flag reads that very env var
            assert _arg(w["args"], "--register-redis") == "$(PREFIX_ROUTER_REDIS_URL)"


def test_default_redis_is_the_bundled_service():
    objs = c.objects()
    _, router = _router(objs)
    svc = c.one(objs, "Service", f"{FULL}-redis")
    assert c.env(router)["PREFIX_ROUTER_REDIS_URL"] == f"redis://{svc['metadata']['name']}:6379/0"
    c.one(objs, "StatefulSet", f"{FULL}-redis")


def test_external_redis_replaces_the_bundled_one():
    values = c.example_values("multi-node.yaml")
    objs = c.objects(values)
    assert not c.find(objs, "StatefulSet", f"{FULL}-redis")
    _, router = _router(objs)
    assert c.env(router)["PREFIX_ROUTER_REDIS_URL"] == values["redis"]["externalUrl"]


def test_redis_url_from_secret_reaches_router_and_workers_alike():
    objs = c.objects({"redis": {"enabled": False,
                                "externalUrlSecret": {"name": "redis-creds", "key": "url"}}})
    _, router = _router(objs)
    ref = c.env(router)["PREFIX_ROUTER_REDIS_URL"]
    assert ref == {"secretKeyRef": {"name": "redis-creds", "key": "url"}}
    for sts in _workers(objs):
        assert c.env(_worker_container(sts))["PREFIX_ROUTER_REDIS_URL"] == ref


def test_worker_args_follow_the_contract():
    objs = c.objects({"workers": {"models": [{
        "name": "llama", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "blockSize": 32,
        "gpuMemoryUtilization": 0.85, "maxModelLen": 16384, "replicas": 3, "gpus": 2}]}})
    sts = c.one(objs, "StatefulSet", f"{FULL}-worker-llama")
    w = _worker_container(sts)
    args = w["args"]
    assert w["command"] == ["prefix-worker"]
    assert "--enable-prefix-caching" in args
    assert _arg(args, "--block-size") == "32"
    assert _arg(args, "--model") == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert _arg(args, "--served-model-name") == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert _arg(args, "--gpu-memory-utilization") == "0.85"
    assert _arg(args, "--max-model-len") == "16384"
    assert _arg(args, "--host") == "0.0.0.0" and _arg(args, "--port") == "8000"
    assert _arg(args, "--kv-events-endpoint") == "tcp://*:5557"
    assert _arg(args, "--lmcache-profile") == "/etc/lmcache/cpu-offload.yaml"
    # the advertised URL is the pod's stable name under the headless service
    headless = c.one(objs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert _arg(args, "--advertise-url") == (
        f"http://$(POD_NAME).{headless['metadata']['name']}:8000")
    assert c.env(w)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert sts["spec"]["replicas"] == 3
    for part in ("requests", "limits"):
        assert w["resources"][part]["nvidia.com/gpu"] == 2


def test_every_block_size_reaches_its_worker():
    objs = c.objects(c.example_values("multi-node.yaml"))
    for sts in _workers(objs):
        args = _worker_container(sts)["args"]
        assert "--enable-prefix-caching" in args
        assert _arg(args, "--block-size") == "16"


def test_hash_seed_is_the_same_everywhere():
    objs = c.objects(c.example_values("multi-node.yaml"))
    seeds = set()
    for kind in ("Deployment", "StatefulSet"):
        for owner in c.find(objs, kind):
            for container in c.containers(owner):
                if container["name"] in ("router", "worker", "lmcache-server"):
                    seeds.add(c.env(container)["PYTHONHASHSEED"])
    assert seeds == {"0"}


def test_routers_and_workers_share_one_key_namespace():
    objs = c.objects({**c.example_values("multi-node.yaml"), "keyPrefix": "team-a:"})
    _, router = _router(objs)
    assert c.env(router)["PREFIX_ROUTER_REDIS_KEY_PREFIX"] == "team-a:"
    for sts in _workers(objs):
        assert c.env(_worker_container(sts))["PREFIX_WORKER_REGISTRY_PREFIX"] == "team-a:"


def test_lmcache_configmap_holds_the_selected_profile():
    for profile in ("cpu-offload", "disk"):
        objs = c.objects({"workerDefaults": {"lmcache": {"profile": profile,
                                                         "cpuOffloadGiB": 33}}})
        sts = _workers(objs)[0]
        key, cfg = _lmcache_cm(objs, sts)
        assert key == f"{profile}.yaml"
        assert _arg(_worker_container(sts)["args"], "--lmcache-profile") == f"/etc/lmcache/{key}"
        shipped = yaml.safe_load((c.CHART / "files" / "lmcache" / key).read_text())
        assert set(shipped) <= set(cfg)
        assert cfg["max_local_cpu_size"] == 33
        assert cfg["chunk_size"] % 16 == 0


def test_disk_tier_path_and_size_come_from_the_mounted_volume():
    objs = c.objects(c.example_values("disk-tier.yaml"))
    sts = _workers(objs)[0]
    _, cfg = _lmcache_cm(objs, sts)
    mount = next(m for m in _worker_container(sts)["volumeMounts"] if m["name"] == "lmcache-disk")
    assert cfg["local_disk"] == f"file://{mount['mountPath']}/"
    assert cfg["max_local_disk_size"] == 500
    claim = next(t for t in sts["spec"]["volumeClaimTemplates"]
                 if t["metadata"]["name"] == "lmcache-disk")
    assert claim["spec"]["resources"]["requests"]["storage"] == "551Gi"


def test_cache_server_address_reaches_remote_url():
    values = c.example_values("multi-node.yaml")
    objs = c.objects(values)
    server = c.one(objs, "Deployment", f"{FULL}-lmcache-server")
    svc = c.one(objs, "Service", f"{FULL}-lmcache-server")
    port = svc["spec"]["ports"][0]["port"]
    container = c.containers(server)[0]
    assert container["command"] == ["lmcache_server"]
    assert container["args"] == ["0.0.0.0", str(port), "cpu"]
    sts = c.one(objs, "StatefulSet", f"{FULL}-worker-llama-3-8b")
    key, cfg = _lmcache_cm(objs, sts)
    assert key == "remote-server.yaml"
    assert cfg["remote_url"] == f"lm://{svc['metadata']['name']}:{port}"
    # the model that overrides its profile gets no remote store
    _, mistral = _lmcache_cm(objs, c.one(objs, "StatefulSet", f"{FULL}-worker-mistral-7b"))
    assert "remote_url" not in mistral


def test_remote_server_profile_without_a_server_fails_clearly():
    with pytest.raises(helm.HelmError, match=r"cacheServer\.enabled"):
        c.render({"workerDefaults": {"lmcache": {"profile": "remote-server"}}})


def test_redis_remote_profile_uses_its_own_redis():
    values = c.example_values("redis-remote.yaml")
    objs = c.objects(values)
    _, cfg = _lmcache_cm(objs, _workers(objs)[0])
    assert cfg["remote_url"] == values["lmcache"]["redisUrl"]
    _, router = _router(objs)
    assert c.env(router)["PREFIX_ROUTER_REDIS_URL"] != cfg["remote_url"]


def test_p2p_profile_gets_per_pod_identity():
    objs = c.objects(c.example_values("p2p.yaml"))
    sts = _workers(objs)[0]
    _, cfg = _lmcache_cm(objs, sts)
    assert cfg["enable_p2p"] is True
    assert cfg["controller_pull_url"] == "lmcache-controller.llm.svc:8300"
    e = c.env(_worker_container(sts))
    assert e["LMCACHE_P2P_HOST"] == "$(POD_IP)"
    assert e["LMCACHE_LMCACHE_INSTANCE_ID"] == "$(POD_NAME)"


def test_router_is_configured_by_env_only():
    objs = c.objects()
    deploy, router = _router(objs)
    assert router["command"] == ["prefix-router", "serve"]
    assert "args" not in router
    e = c.env(router)
    assert e["PREFIX_ROUTER_HOST"] == "0.0.0.0"
    assert e["PREFIX_ROUTER_PORT"] == "8000"
    assert e["PREFIX_ROUTER_POLICY"] == "prefix_aware"
    assert e["PREFIX_ROUTER_BOUND_EPSILON"] == "0.25"
    assert e["PREFIX_ROUTER_REDIS_KEY_PREFIX"] == "prefix-router:"
    secret_ref = e["PREFIX_ROUTER_ADMIN_TOKEN"]["secretKeyRef"]
    secret = c.one(objs, "Secret", secret_ref["name"])
    assert secret_ref["key"] in secret["data"]
    assert router["livenessProbe"]["httpGet"]["path"] == "/health"
    assert router["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert deploy["spec"]["replicas"] == 2
    c.one(objs, "PodDisruptionBudget", f"{FULL}-router")
    svc = c.one(objs, "Service", f"{FULL}-router")
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]


def test_existing_admin_secret_is_used_not_created():
    objs = c.objects(c.example_values("multi-node.yaml"))
    _, router = _router(objs)
    assert c.env(router)["PREFIX_ROUTER_ADMIN_TOKEN"]["secretKeyRef"] == {
        "name": "prefix-router-admin", "key": "token"}
    assert not c.find(objs, "Secret")


def test_hpa_owns_replicas_when_enabled():
    objs = c.objects(c.example_values("multi-node.yaml"))
    deploy, _ = _router(objs)
    assert "replicas" not in deploy["spec"]
    hpa = c.one(objs, "HorizontalPodAutoscaler", f"{FULL}-router")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)


def test_monitoring_objects():
    objs = c.objects(c.example_values("multi-node.yaml"))
    monitors = c.find(objs, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {f"{FULL}-router", f"{FULL}-workers"}
    assert all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors)
    dash = c.one(objs, "ConfigMap", f"{FULL}-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["data"]["prefix-router.json"] == (
        c.DEPLOY / "grafana" / "prefix-router.json").read_text().rstrip("\n")


def test_sidecar_router_listens_on_loopback_beside_the_app():
    values = c.example_values("sidecar.yaml")
    objs = c.objects(values)
    assert not c.find(objs, "Deployment", f"{FULL}-router")
    assert not c.find(objs, "StatefulSet")
    app = c.one(objs, "Deployment", f"{FULL}-rag-api")
    names = [x["name"] for x in c.containers(app)]
    assert names == ["prefix-router", "rag-api"]
    router = c.containers(app)[0]
    assert router["restartPolicy"] == "Always"  # native sidecar
    assert router["command"] == ["prefix-router", "serve"]
    e = c.env(router)
    assert e["PREFIX_ROUTER_HOST"] == "127.0.0.1"
    assert e["PREFIX_ROUTER_REDIS_URL"] == values["redis"]["externalUrl"]
    assert e["PREFIX_ROUTER_DISCOVER"] == "true"
    port = e["PREFIX_ROUTER_PORT"]
    assert c.env(c.containers(app)[1])["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1"
    c.one(objs, "Service", f"{FULL}-rag-api")


def test_sidecar_as_plain_second_container():
    values = c.example_values("sidecar.yaml")
    values["sidecar"]["native"] = False
    app = c.one(c.objects(values), "Deployment", f"{FULL}-rag-api")
    spec = app["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert [x["name"] for x in spec["containers"]] == ["rag-api", "prefix-router"]


def test_without_redis_the_router_lists_in_chart_workers():
    objs = c.objects(c.example_values("no-redis.yaml"))
    _, router = _router(objs)
    e = c.env(router)
    assert "PREFIX_ROUTER_REDIS_URL" not in e
    assert e["PREFIX_ROUTER_DISCOVER"] == "false"
    svc = f"{FULL}-worker-llama-3-8b"
    assert e["PREFIX_ROUTER_WORKERS"] == (
        f"llama-3-8b-0=http://{svc}-0.{svc}:8000,llama-3-8b-1=http://{svc}-1.{svc}:8000")
    args = _worker_container(_workers(objs)[0])["args"]
    assert "--register-redis" not in args and "--kv-events-endpoint" not in args


def test_chunk_size_must_align_with_block_size():
    with pytest.raises(helm.HelmError, match="multiple of blockSize"):
        c.render({"workerDefaults": {"lmcache": {"config": {"chunk_size": 200}}}})


UPSTREAM = {"caSecret": "worker-ca", "caKey": "ca.pem", "apiKeysSecret": "worker-keys"}


def _upstream_wired(pod_owner, container):
    """The CA bundle and the keys file reach the router as files from their Secrets."""
    e = c.env(container)
    assert e["PREFIX_ROUTER_UPSTREAM_CA_FILE"] == "/etc/prefix-router/upstream-ca/ca.pem"
    assert e["PREFIX_ROUTER_UPSTREAM_API_KEYS_FILE"] == \
        "/etc/prefix-router/upstream-keys/upstream-keys"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["upstream-ca"]["mountPath"] == "/etc/prefix-router/upstream-ca"
    assert mounts["upstream-keys"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod_owner["spec"]["template"]["spec"]["volumes"]}
    assert volumes["upstream-ca"]["secret"]["secretName"] == "worker-ca"
    assert volumes["upstream-ca"]["secret"]["items"] == [{"key": "ca.pem", "path": "ca.pem"}]
    assert volumes["upstream-keys"]["secret"]["secretName"] == "worker-keys"
    c.validate(pod_owner)


def test_upstream_ca_and_keys_come_from_secrets_in_every_router_container():
    objs = c.objects({"router": {"upstream": UPSTREAM}})
    _upstream_wired(*_router(objs))
    sidecar = c.example_values("sidecar.yaml")
    sidecar.setdefault("router", {})["upstream"] = UPSTREAM
    app = c.one(c.objects(sidecar), "Deployment", f"{FULL}-rag-api")
    _upstream_wired(app, c.containers(app)[0])
    epp = c.example_values("epp.yaml")
    epp.setdefault("router", {})["upstream"] = UPSTREAM
    picker = c.one(c.objects(epp), "Deployment", f"{FULL}-epp")
    _upstream_wired(picker, next(x for x in c.containers(picker) if x["name"] == "epp"))


def test_without_upstream_secrets_nothing_is_mounted():
    _, router = _router(c.objects())
    assert not {"PREFIX_ROUTER_UPSTREAM_CA_FILE", "PREFIX_ROUTER_UPSTREAM_API_KEYS_FILE"} \
        & set(c.env(router))
    assert [m["name"] for m in router["volumeMounts"]] == ["tmp"]
