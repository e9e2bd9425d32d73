{{/* Names ---------------------------------------------------------------- */}}

{{- define "prefix-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name; worker names add "-worker-<model>", so keep it short. */}}
{{- define "prefix-router.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "prefix-router.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "prefix-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prefix-router
{{- end -}}

{{/* Selector labels: call with (dict "root" $ "component" "router"). */}}
{{- define "prefix-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefix-router.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "prefix-router.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}

{{/* Redis ---------------------------------------------------------------- */}}

{{- define "prefix-router.redisHost" -}}
{{- printf "%s-redis" (include "prefix-router.fullname" .) -}}
{{- end -}}

{{/* "true" when routers and workers have a Redis (bundled or external). */}}
{{- define "prefix-router.hasRedis" -}}
{{- if or .Values.redis.enabled .Values.redis.externalUrl .Values.redis.externalUrlSecret.name -}}true{{- end -}}
{{- end -}}

{{/*
The one env var both routers and workers read the fleet's Redis from, so they can never
disagree: the bundled Service, a literal external URL, or a key of an external Secret.
*/}}
{{- define "prefix-router.redisEnv" -}}
- name: PREFIX_ROUTER_REDIS_URL
{{- if .Values.redis.enabled }}
  value: {{ printf "redis://%s:6379/0" (include "prefix-router.redisHost" .) | quote }}
{{- else if .Values.redis.externalUrlSecret.name }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.externalUrlSecret.name }}
      key: {{ .Values.redis.externalUrlSecret.key }}
{{- else }}
  value: {{ .Values.redis.externalUrl | quote }}
{{- end }}
{{- end -}}

{{/* Router --------------------------------------------------------------- */}}

{{- define "prefix-router.adminSecretName" -}}
{{- .Values.router.adminToken.existingSecret | default (printf "%s-admin" (include "prefix-router.fullname" .)) -}}
{{- end -}}

{{- define "prefix-router.workerName" -}}
{{- printf "%s-worker-%s" (include "prefix-router.fullname" .root) .model.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A model entry over workerDefaults (deep merge; the entry wins). */}}
{{- define "prefix-router.worker" -}}
{{- $defaults := deepCopy .root.Values.workerDefaults -}}
{{- toYaml (mergeOverwrite $defaults (deepCopy .model)) -}}
{{- end -}}

{{/*
Static worker list for PREFIX_ROUTER_WORKERS: router.workers plus, when there is no Redis
registry to discover them from, every in-chart worker pod by its stable DNS name.
*/}}
{{- define "prefix-router.staticWorkers" -}}
{{- $root := . -}}
{{- $urls := list -}}
{{- range .Values.router.workers }}{{ $urls = append $urls . }}{{ end -}}
{{- if not (include "prefix-router.hasRedis" .) -}}
{{- range $m := .Values.workers.models -}}
{{- $w := include "prefix-router.worker" (dict "root" $root "model" $m) | fromYaml -}}
{{- $svc := include "prefix-router.workerName" (dict "root" $root "model" $w) -}}
{{- range $i := until (int $w.replicas) -}}
{{- $urls = append $urls (printf "%s-%d=http://%s-%d.%s:8000" $w.name $i $svc $i $svc) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/*
Router environment, shared by the router Deployment and the sidecar (host differs).
Call with (dict "root" $ "host" "0.0.0.0").
*/}}
{{- define "prefix-router.routerEnv" -}}
{{- $v := .root.Values -}}
- name: PREFIX_ROUTER_HOST
  value: {{ .host | quote }}
- name: PREFIX_ROUTER_PORT
  value: {{ $v.router.port | quote }}
- name: PREFIX_ROUTER_POLICY
  value: {{ $v.router.policy | quote }}
- name: PREFIX_ROUTER_BOUND_EPSILON
  value: {{ $v.router.boundEpsilon | quote }}
{{- if $v.router.blockChars }}
- name: PREFIX_ROUTER_BLOCK_CHARS
  value: {{ $v.router.blockChars | quote }}
{{- end }}
- name: PREFIX_ROUTER_LOG_LEVEL
  value: {{ $v.router.logLevel | quote }}
- name: PREFIX_ROUTER_REDIS_KEY_PREFIX
  value: {{ $v.keyPrefix | quote }}
{{- if include "prefix-router.hasRedis" .root }}
{{ include "prefix-router.redisEnv" .root }}
- name: PREFIX_ROUTER_DISCOVER
  value: "true"
{{- else }}
- name: PREFIX_ROUTER_DISCOVER
  value: "false"
{{- end }}
{{- with include "prefix-router.staticWorkers" .root }}
- name: PREFIX_ROUTER_WORKERS
  value: {{ . | quote }}
{{- end }}
- name: PREFIX_ROUTER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "prefix-router.adminSecretName" .root }}
      key: {{ $v.router.adminToken.secretKey }}
- name: PYTHONHASHSEED
  value: {{ $v.pythonHashSeed | quote }}
{{- with include "prefix-router.upstreamEnv" .root }}
{{ . }}
{{- end }}
{{- with $v.router.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Upstream TLS and credentials: env, mounts and volumes of every router container. */}}
{{- define "prefix-router.upstreamEnv" -}}
{{- $u := .Values.router.upstream -}}
{{- if $u.caSecret }}
- name: PREFIX_ROUTER_UPSTREAM_CA_FILE
  value: {{ printf "/etc/prefix-router/upstream-ca/%s" $u.caKey | quote }}
{{- end }}
{{- if $u.apiKeysSecret }}
- name: PREFIX_ROUTER_UPSTREAM_API_KEYS_FILE
  value: {{ printf "/etc/prefix-router/upstream-keys/%s" $u.apiKeysKey | quote }}
{{- end }}
{{- end -}}

{{- define "prefix-router.upstreamMounts" -}}
{{- $u := .Values.router.upstream -}}
{{- if $u.caSecret }}
- {name: upstream-ca, mountPath: /etc/prefix-router/upstream-ca, readOnly: true}
{{- end }}
{{- if $u.apiKeysSecret }}
- {name: upstream-keys, mountPath: /etc/prefix-router/upstream-keys, readOnly: true}
{{- end }}
{{- end -}}

{{- define "prefix-router.upstreamVolumes" -}}
{{- $u := .Values.router.upstream -}}
{{- if $u.caSecret }}
- name: upstream-ca
  secret:
    secretName: {{ $u.caSecret }}
    items: [{key: {{ $u.caKey }}, path: {{ $u.caKey }}}]
{{- end }}
{{- if $u.apiKeysSecret }}
- name: upstream-keys
  secret:
    secretName: {{ $u.apiKeysSecret }}
    defaultMode: 0400
    items: [{key: {{ $u.apiKeysKey }}, path: {{ $u.apiKeysKey }}}]
{{- end }}
{{- end -}}

{{/* Hardened container defaults: the router needs no privileges and no writable root. */}}
{{- define "prefix-router.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* LMCache ---------------------------------------------------------------- */}}

{{- define "prefix-router.cacheServerName" -}}
{{- printf "%s-lmcache-server" (include "prefix-router.fullname" .) -}}
{{- end -}}

{{/*
The selected profile's LMCache YAML for one worker (call with (dict "root" $ "w" $worker)):
the chart's copy of lmcache_config/<profile>.yaml (files/lmcache/, kept identical by a test), then what the chart wires (remote
address, tier sizes, disk path), then the model's own lmcache.config overrides.
*/}}
{{- define "prefix-router.lmcacheConfig" -}}
{{- $root := .root -}}
{{- $lm := .w.lmcache -}}
{{- $file := printf "files/lmcache/%s.yaml" $lm.profile -}}
{{- $cfg := $root.Files.Get $file | fromYaml -}}
{{- if not $cfg -}}{{- fail (printf "LMCache profile %s not found in the chart (%s)" $lm.profile $file) -}}{{- end -}}
{{- $wired := dict "max_local_cpu_size" $lm.cpuOffloadGiB -}}
{{- if eq $lm.profile "disk" -}}
{{- $_ := set $wired "local_disk" (printf "file://%s/" (trimSuffix "/" $lm.disk.path)) -}}
{{- $_ := set $wired "max_local_disk_size" $lm.disk.sizeGiB -}}
{{- else if eq $lm.profile "remote-server" -}}
{{- if not $root.Values.cacheServer.enabled -}}
{{- fail (printf "worker %s uses LMCache profile remote-server: set cacheServer.enabled=true" .w.name) -}}
{{- end -}}
{{- $_ := set $wired "remote_url" (printf "lm://%s:%d" (include "prefix-router.cacheServerName" $root) (int $root.Values.cacheServer.port)) -}}
{{- else if eq $lm.profile "redis-remote" -}}
{{- $url := $root.Values.lmcache.redisUrl -}}
{{- if not $url -}}
{{- fail (printf "worker %s uses LMCache profile redis-remote: set lmcache.redisUrl (a Redis of its own, not the routing one)" .w.name) -}}
{{- end -}}
{{- $_ := set $wired "remote_url" $url -}}
{{- else if eq $lm.profile "p2p" -}}
{{- with $root.Values.lmcache.controller.pullUrl }}{{ $_ := set $wired "controller_pull_url" . }}{{ end -}}
{{- with $root.Values.lmcache.controller.replyUrl }}{{ $_ := set $wired "controller_reply_url" . }}{{ end -}}
{{- end -}}
{{- $cfg = mergeOverwrite $cfg $wired (deepCopy ($lm.config | default dict)) -}}
{{- $chunk := int (index $cfg "chunk_size") -}}
{{- if ne 0 (mod $chunk (int .w.blockSize)) -}}
{{- fail (printf "worker %s: LMCache chunk_size %d must be a multiple of blockSize %d" .w.name $chunk (int .w.blockSize)) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Sidecar ---------------------------------------------------------------- */}}

{{/* The router container of the sidecar pod; bound to loopback, so only the app sees it. */}}
{{- define "prefix-router.sidecarContainer" -}}
{{- $r := .Values.router -}}
name: prefix-router
image: {{ include "prefix-router.image" (dict "root" . "image" $r.image) }}
imagePullPolicy: {{ $r.image.pullPolicy }}
command: ["prefix-router", "serve"]
env:
  {{- include "prefix-router.routerEnv" (dict "root" . "host" "127.0.0.1") | nindent 2 }}
{{- if .Values.sidecar.native }}
restartPolicy: Always
{{- end }}
# The kubelet probes the pod IP, which a loopback-bound router does not listen on:
# probe from inside the container instead.
startupProbe:
  exec:
    command: ["python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:{{ $r.port }}/health', timeout=2)"]
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  exec:
    command: ["python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:{{ $r.port }}/health', timeout=2)"]
  periodSeconds: 10
  timeoutSeconds: 5
resources:
  {{- toYaml $r.resources | nindent 2 }}
securityContext:
  {{- include "prefix-router.restrictedSecurityContext" . | nindent 2 }}
volumeMounts:
  - {name: router-tmp, mountPath: /tmp}
  {{- with include "prefix-router.upstreamMounts" . }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end -}}
