{{- define "ragr1.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The name of one component's objects: <fullname>-<component>. Call with (list $ "component"). */}}
{{- define "ragr1.name" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "ragr1.fullname" $root) (index . 1) -}}
{{- end -}}

{{- define "ragr1.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "ragr1.labels" -}}
{{- $root := index . 0 -}}
{{ include "ragr1.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end -}}

{{/* The image of a role (list $ "reward"): <registry>/<repository>:<tag>. */}}
{{- define "ragr1.image" -}}
{{- $root := index . 0 -}}
{{- $image := index $root.Values.image (index . 1) -}}
{{- $name := printf "%s:%s" $image.repository ($image.tag | default $root.Values.image.tag) -}}
{{- with $root.Values.image.registry -}}
{{- $name = printf "%s/%s" (trimSuffix "/" .) $name -}}
{{- end -}}
{{ $name | quote }}
{{- end -}}

{{- define "ragr1.metricsPort" -}}
{{- $root := index . 0 -}}
{{- add (index . 1) $root.Values.ports.metricsOffset -}}
{{- end -}}

{{- define "ragr1.authSecret" -}}
{{- .Values.auth.existingSecret | default (include "ragr1.name" (list . "auth")) -}}
{{- end -}}

{{- define "ragr1.redisSecret" -}}
{{- .Values.redis.existingSecret | default (include "ragr1.name" (list . "redis")) -}}
{{- end -}}

{{/* The Redis URL, with the password from the environment variable REDIS_PASSWORD (see ragr1.redisEnv);
rediss:// (TLS) when tls.enabled: the in-chart Redis then serves TLS only, with the chart's certificate. */}}
{{- define "ragr1.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "%s://:$(REDIS_PASSWORD)@%s:6379/0" (ternary "rediss" "redis" .Values.tls.enabled) (include "ragr1.name" (list . "redis")) -}}
{{- else -}}
{{- required "redis.url is required when redis.enabled is false" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* Redis over TLS: the in-chart Redis with tls.enabled, or an external rediss:// one (whose certificate
the chart's CA must then have signed). */}}
{{- define "ragr1.redisTls" -}}
{{- if and .Values.tls.enabled (or .Values.redis.enabled (hasPrefix "rediss://" .Values.redis.url)) -}}
true
{{- end -}}
{{- end -}}

{{/* Where the TLS certificates (tls.crt, tls.key, ca.crt) and the auth token are mounted in every pod. */}}
{{- define "ragr1.tlsDir" -}}
/var/run/secrets/ragr1/tls
{{- end -}}

{{- define "ragr1.authDir" -}}
/var/run/secrets/ragr1/auth
{{- end -}}

{{- define "ragr1.redisEnv" -}}
{{- if .Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "ragr1.redisSecret" . }}
      key: redis-password
{{- end }}
- name: RAGR1_REDIS_URL
  value: {{ include "ragr1.redisUrl" . | quote }}
{{- if include "ragr1.redisTls" . }}
- name: RAGR1_REDIS_CA_FILE
  value: {{ include "ragr1.tlsDir" . }}/ca.crt
{{- if .Values.tls.mutual }}
- name: RAGR1_REDIS_CERT_FILE
  value: {{ include "ragr1.tlsDir" . }}/tls.crt
- name: RAGR1_REDIS_KEY_FILE
  value: {{ include "ragr1.tlsDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Environment every ragr1 container gets: listen address, drain time, auth and TLS for servers and clients. */}}
{{- define "ragr1.env" -}}
- name: RAGR1_HOST
  value: "0.0.0.0"
- name: RAGR1_DRAIN_SECONDS
  value: {{ .Values.drainSeconds | quote }}
{{- if .Values.auth.enabled }}
- name: RAGR1_AUTH_TOKEN_FILE
  value: {{ include "ragr1.authDir" . }}/token
- name: RAGR1_CLIENT_TOKEN_FILE
  value: {{ include "ragr1.authDir" . }}/token
{{- end }}
{{- if .Values.tls.enabled }}
- name: RAGR1_TLS_CERT_FILE
  value: {{ include "ragr1.tlsDir" . }}/tls.crt
- name: RAGR1_TLS_KEY_FILE
  value: {{ include "ragr1.tlsDir" . }}/tls.key
- name: RAGR1_CLIENT_CA_FILE
  value: {{ include "ragr1.tlsDir" . }}/ca.crt
{{- if .Values.tls.mutual }}
- name: RAGR1_TLS_CLIENT_CA_FILE
  value: {{ include "ragr1.tlsDir" . }}/ca.crt
- name: RAGR1_CLIENT_CERT_FILE
  value: {{ include "ragr1.tlsDir" . }}/tls.crt
- name: RAGR1_CLIENT_KEY_FILE
  value: {{ include "ragr1.tlsDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "ragr1.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.auth.enabled }}
- name: auth
  mountPath: {{ include "ragr1.authDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "ragr1.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "ragr1.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.auth.enabled }}
- name: auth
  secret:
    secretName: {{ include "ragr1.authSecret" . }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
{{- end }}
{{- end -}}

{{/* Liveness and readiness through grpc.health.v1: Kubernetes' native gRPC probe, or the ragr1
probe with the CA when the server speaks TLS (the native probe cannot). Readiness asks the server's own
status; startup and liveness ask the "liveness" service (ragr1/services/common/server.py LIVENESS), SERVING
while the server runs: a server that is up but not ready (a policy replica that refused a weight version)
gets no traffic and is not restarted into the same refusal. Call with (list $ port). */}}
{{- define "ragr1.probes" -}}
{{- $root := index . 0 -}}
{{- $port := index . 1 -}}
{{- $ready := dict "grpc" (dict "port" $port) -}}
{{- $alive := dict "grpc" (dict "port" $port "service" "liveness") -}}
{{- if $root.Values.tls.enabled -}}
{{- $command := list "python" "-m" "ragr1.services.common.healthcheck" (printf "localhost:%v" $port) "--ca-file" (printf "%s/ca.crt" (include "ragr1.tlsDir" $root)) -}}
{{- $ready = dict "exec" (dict "command" $command) -}}
{{- $alive = dict "exec" (dict "command" (concat $command (list "--service" "liveness"))) -}}
{{- end -}}
startupProbe:
  {{- toYaml $alive | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 90
readinessProbe:
  {{- toYaml $ready | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- toYaml $alive | nindent 2 }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{/* Container ports: gRPC and metrics. Call with (list $ grpcPort). */}}
{{- define "ragr1.containerPorts" -}}
- name: grpc
  containerPort: {{ index . 1 }}
- name: metrics
  containerPort: {{ include "ragr1.metricsPort" . }}
{{- end -}}

{{- define "ragr1.podDefaults" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Resources with an nvidia.com/gpu request and limit when gpus > 0. Call with (list resources gpus). */}}
{{- define "ragr1.resources" -}}
{{- $res := deepCopy (index . 0 | default dict) -}}
{{- $gpus := int (index . 1) -}}
{{- if gt $gpus 0 -}}
{{- $_ := set $res "requests" (merge (dict "nvidia.com/gpu" $gpus) ($res.requests | default dict)) -}}
{{- $_ := set $res "limits" (merge (dict "nvidia.com/gpu" $gpus) ($res.limits | default dict)) -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/* The trainer's command line (the same in a Deployment and as a RayJob entrypoint). */}}
{{- define "ragr1.trainerArgs" -}}
- train
- ppo
- --port
- {{ .Values.ports.trainer | quote }}
- --output-dir
- /checkpoints
- --model
- {{ .Values.trainer.model | quote }}
- --max-updates
- "0"
- --samples-per-prompt
- {{ include "ragr1.samplesPerPrompt" . | quote }}
{{- with .Values.trainer.alarms }}
- --prompts-stranded-seconds
- {{ .promptsStrandedSeconds | quote }}
- --likelihood-falling-updates
- {{ .likelihoodFallingUpdates | quote }}
- --entropy-floor
- {{ .entropyFloor | quote }}
- --kl-ceiling
- {{ .klCeiling | quote }}
- --logprob-gap-threshold
- {{ .logprobGapThreshold | quote }}
{{- end }}
{{- with .Values.trainer.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ragr1.indexClaim" -}}
{{- .Values.index.existingClaim | default (include "ragr1.name" (list . "index")) -}}
{{- end -}}

{{- define "ragr1.checkpointsClaim" -}}
{{- .Values.checkpoints.existingClaim | default (include "ragr1.name" (list . "checkpoints")) -}}
{{- end -}}

{{- define "ragr1.trainerMounts" -}}
- name: checkpoints
  mountPath: /checkpoints
- name: shm
  mountPath: /dev/shm
{{- if .Values.models.existingClaim }}
- name: models
  mountPath: /models
  readOnly: true
{{- end }}
{{- end -}}

{{- define "ragr1.trainerVolumes" -}}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ include "ragr1.checkpointsClaim" . }}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.trainer.shmSize }}
{{- if .Values.models.existingClaim }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .Values.models.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* A URL part with its %XX escapes decoded (ASCII), as redis-py decodes a password in the URL; %25 last,
so that the % it gives starts no second escape. */}}
{{- define "ragr1.urlUnescape" -}}
{{- $out := . -}}
{{- $escapes := regexFindAll "%[0-9A-Fa-f]{2}" . -1 | uniq | sortAlpha -}}
{{- range $esc := concat (without $escapes "%25") (ternary (list "%25") list (has "%25" $escapes)) -}}
{{- $out = replace $esc (printf "%c" (int (printf "0x%s" (trimPrefix "%" $esc)))) $out -}}
{{- end -}}
{{- $out -}}
{{- end -}}

{{/* Whether the release is scraped by the Prometheus operator (a ServiceMonitor and the alert rules): asked for
(metrics.serviceMonitor.enabled), or needed by the KEDA autoscaler, whose triggers read the trainer's series
as that Prometheus labels them. */}}
{{- define "ragr1.monitored" -}}
{{- if or .Values.metrics.serviceMonitor.enabled .Values.policy.autoscaling.enabled -}}true{{- end -}}
{{- end -}}

{{/* The trajectories one policy replica runs at once, by the rule of policy.maxInFlight that the worker applies
(resolve_max_in_flight in ragr1/services/policy/streaming.py): 0 follows the engine's batch, policy.maxNumSeqs
here (the worker also counts what the KV cache holds, which the chart cannot know); a number caps it. The chart
passes maxInFlight itself to the worker, and states the rule only here, for what it sizes from it. */}}
{{- define "ragr1.policy.maxInFlight" -}}
{{- $p := .Values.policy -}}
{{- $p.maxInFlight | int | default ($p.maxNumSeqs | int) -}}
{{- end -}}

{{/* The prompts per policy replica KEDA aims at: policy.autoscaling.promptsPerReplica, or with 0 the prompts one
replica runs at once. The trainer's backlog counts prompts, and a prompt brings trainer.samplesPerPrompt
trajectories (its group, run on one replica), so that is the trajectories a replica runs at once
(ragr1.policy.maxInFlight) over the samples per prompt, at least 1 (a group larger than the batch runs alone): no
replica is started with less work than its engine batches, nor a fleet left too small while prompts wait. Rounded
down: the fleet errs larger. */}}
{{- define "ragr1.promptsPerReplica" -}}
{{- $trajectories := include "ragr1.policy.maxInFlight" . | int -}}
{{- .Values.policy.autoscaling.promptsPerReplica | int | default (max 1 (div $trajectories (include "ragr1.samplesPerPrompt" . | int))) -}}
{{- end -}}

{{/* trainer.samplesPerPrompt: the one value the trainer's --samples-per-prompt and KEDA's target both read; the same
flag in trainer.extraArgs would change the trainer alone, so it is refused. */}}
{{- define "ragr1.samplesPerPrompt" -}}
{{- range .Values.trainer.extraArgs -}}
{{- if or (eq (toString .) "--samples-per-prompt") (hasPrefix "--samples-per-prompt=" (toString .)) -}}
{{- fail "trainer.extraArgs sets --samples-per-prompt: set trainer.samplesPerPrompt instead, which the trainer and the policy autoscaler's target (prompts per replica) both read" -}}
{{- end -}}
{{- end -}}
{{- .Values.trainer.samplesPerPrompt | int -}}
{{- end -}}
