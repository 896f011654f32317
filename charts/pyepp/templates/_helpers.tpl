{{/* Names: the InferencePool is the release name; the EPP objects are <release>-epp. */}}
{{- define "pyepp.poolName" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pyepp.eppName" -}}
{{- printf "%s-epp" (include "pyepp.poolName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pyepp.serviceAccountName" -}}
{{- if .Values.inferenceExtension.serviceAccount.create -}}
{{- default (include "pyepp.eppName" .) .Values.inferenceExtension.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.inferenceExtension.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pyepp.labels" -}}
app.kubernetes.io/name: pyepp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "pyepp.selectorLabels" -}}
app.kubernetes.io/name: pyepp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "pyepp.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- if $img.registry -}}
{{- printf "%s/%s:%s" $img.registry $img.repository (toString $img.tag) -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (toString $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "pyepp.appProtocol" -}}
{{- if eq .Values.inferencePool.modelServerProtocol "grpc" -}}kubernetes.io/h2c{{- else -}}http{{- end -}}
{{- end -}}

{{/* The default EndpointPickerConfig: every scorer in one profile with its weight, then the picker. */}}
{{- define "pyepp.defaultPluginsConfig" -}}
{{- $s := .Values.inferenceExtension.scheduling -}}
{{- $engine := lower (toString (default "vllm" .Values.inferencePool.modelServerType)) -}}
{{- $mds := deepCopy (default dict .Values.inferenceExtension.metricsDataSource) -}}
{{- if and (eq $engine "trtllm-serve") (eq (toString (default "/metrics" $mds.path)) "/metrics") -}}
{{- $_ := set $mds "path" "/prometheus/metrics" -}}
{{- end -}}
{{- $parsers := splitList "," (include "pyepp.parsers" .) | compact -}}
{{- $lp := default dict .Values.inferenceExtension.latencyPredictor -}}
{{- $custom := and (not $s.dataLayer) (or (ne $engine "vllm") (ne (toString (default "http" $mds.scheme)) "http") (ne (toString (default "/metrics" $mds.path)) "/metrics") (eq (toString $mds.insecureSkipVerify) "false")) -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
{{- with $s.featureGates }}
featureGates:
  {{- toYaml . | nindent 2 }}
{{- end }}
plugins:
{{- if $custom }}
- type: metrics-data-source
  parameters:
    scheme: {{ default "http" $mds.scheme }}
    path: {{ default "/metrics" $mds.path }}
    insecureSkipVerify: {{ ne (toString $mds.insecureSkipVerify) "false" }}
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ $engine }}
{{- end }}
{{- /* llm-d-router's tokenizer sidecar (router.tokenizer): the default's precise producer tokenizes through it. */}}
{{- $tok := default dict (default dict .Values.router).tokenizer -}}
{{- $types := list -}}
{{- range $s.extraPlugins }}{{ $types = append $types (toString .type) }}{{ end -}}
{{- if and $tok.enabled (has "precise-prefix-cache-producer" $types) (not (has "token-producer" $types)) (not (has "tokenizer" $types)) }}
- type: token-producer
  parameters:
    modelName: {{ $tok.modelName | quote }}
    vllm:
      url: {{ printf "http://localhost:%d" (int (default 8000 $tok.port)) | quote }}
{{- end }}
{{- range $s.extraPlugins }}
{{- $params := deepCopy (default dict .parameters) }}
{{- if eq (toString .type) "precise-prefix-cache-producer" }}
{{- /* The engine the pool runs: SGLang's events, or none at all (the producer's approximateFallback routes). */}}
{{- $kec := deepCopy (default dict $params.kvEventsConfig) }}
{{- if and (eq $engine "sglang") (not (hasKey $kec "engineType")) }}
{{- $_ := set $kec "engineType" "sglang" }}
{{- else if and (not (has $engine (list "vllm" "sglang"))) (not (hasKey $kec "enabled")) }}
{{- $_ := set $kec "enabled" false }}
{{- end }}
{{- if $kec }}
{{- $_ := set $params "kvEventsConfig" $kec }}
{{- end }}
{{- end }}
- type: {{ required "scheduling.extraPlugins[].type is required" .type }}
  {{- with .name }}
  name: {{ . }}
  {{- end }}
  {{- with $params }}
  parameters:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- range $s.scorers }}
- type: {{ required "scheduling.scorers[].type is required" .type }}
  {{- with .name }}
  name: {{ . }}
  {{- end }}
  {{- with .parameters }}
  parameters:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
- type: {{ $s.picker.type }}
  {{- with $s.picker.parameters }}
  parameters:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- range $parsers }}
- type: {{ . }}
{{- end }}
{{- if $lp.enabled }}
{{- /* The anchors' latency-predictor profile (their predictor's sidecars become pyepp's in-process model). */}}
- type: predicted-latency-producer
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.99
    {{- if eq (toString .Values.pyeppLatencyVariant) "router" }}
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
    {{- end }}
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.80
    {{- if eq (toString .Values.pyeppLatencyVariant) "router" }}
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
    {{- end }}
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
{{- else }}
schedulingProfiles:
- name: default
  plugins:
  {{- range $s.profileFilters }}
  - pluginRef: {{ . }}
  {{- end }}
  {{- range $s.scorers }}
  - pluginRef: {{ default .type .name }}
    weight: {{ .weight | default 1 }}
  {{- end }}
  - pluginRef: {{ default $s.picker.type $s.picker.name }}
{{- end }}
{{- with $parsers }}
requestHandler:
  parsers:
  {{- range . }}
  - pluginRef: {{ . }}
  {{- end }}
{{- end }}
{{- with $s.dataLayer }}
dataLayer:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $custom }}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
{{- end }}
{{- end -}}

{{/* The decode-side routing sidecar container (P/D). */}}
{{- define "pyepp.routingSidecarContainer" -}}
{{- $rs := .Values.routingSidecar -}}
{{- $img := mergeOverwrite (deepCopy .Values.inferenceExtension.image) ($rs.image | default dict) -}}
name: routing-sidecar
image: {{ printf "%s/%s:%s" $img.registry $img.repository $img.tag }}
imagePullPolicy: {{ $img.pullPolicy }}
command: ["epp-pd-sidecar"]
args:
  - --port={{ $rs.port }}
  - --model-server-port={{ $rs.modelServerPort }}
  - --kv-connector={{ $rs.kvConnector }}
  - --prefill-max-retries={{ $rs.prefillMaxRetries }}
  - --prefill-timeout={{ $rs.prefillTimeout }}
  - --secure-proxy={{ $rs.secureProxy }}
  - --enable-ssrf-protection={{ $rs.enableSSRFProtection }}
  {{- if $rs.enableSSRFProtection }}
  - --inference-pool={{ .Release.Namespace }}/{{ include "pyepp.poolName" . }}
  - --pool-group={{ (split "/" .Values.inferencePool.apiVersion)._0 }}
  {{- end }}
  {{- range $key, $value := $rs.flags }}
  - --{{ $key }}={{ $value }}
  {{- end }}
ports:
  - name: sidecar
    containerPort: {{ $rs.port }}
    protocol: TCP
readinessProbe:
  httpGet:
    path: /health
    port: {{ $rs.port }}
    scheme: {{ if $rs.secureProxy }}HTTPS{{ else }}HTTP{{ end }}
  periodSeconds: 5
resources:
  {{- toYaml $rs.resources | nindent 2 }}
securityContext:
  {{- toYaml $rs.securityContext | nindent 2 }}
{{- end -}}

{{/* The request parsers of the default config, as the anchors' charts pick them: vLLM over gRPC gets
vllmgrpc-parser; else router.epp.parsers (or GIE's inferencePool.parser); else Triton gets passthrough-parser; else
none (every built-in parser, auto-selected). Comma-separated. */}}
{{- define "pyepp.parsers" -}}
{{- $engine := lower (toString (default "vllm" .Values.inferencePool.modelServerType)) -}}
{{- $proto := lower (toString (default "http" .Values.inferencePool.modelServerProtocol)) -}}
{{- if and (eq $engine "vllm") (eq $proto "grpc") -}}vllmgrpc-parser
{{- else if .Values.inferenceExtension.parsers -}}{{ join "," .Values.inferenceExtension.parsers }}
{{- else if eq $engine "triton" -}}passthrough-parser
{{- end -}}
{{- end -}}

{{/* llm-d-router's request-format agnostic config, shipped in its chart's ConfigMap as payload-agnostic.yaml (select
it with pluginsConfigFile: payload-agnostic.yaml). */}}
{{- define "pyepp.payloadAgnosticConfig" -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: passthrough-parser
- type: active-request-scorer
- type: session-affinity-scorer
requestHandler:
  parsers:
  - pluginRef: passthrough-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: active-request-scorer
    weight: 1
  - pluginRef: session-affinity-scorer
    weight: 1
{{- end -}}
