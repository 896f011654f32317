{{/*
Drop-in values: besides this chart's own layout (GIE's `inferencepool` chart: inferenceExtension.*, inferencePool.*,
provider.*, experimentalHttpRoute.*), accept llm-d-router's chart layout (router.epp.*, router.modelServers.*,
router.inferencePool.*, router.monitoring/tracing, top-level httpRoute.*) by mapping it onto ours, once per render.
Every template includes "pyepp.normalize" first; it is idempotent.
*/}}
{{- define "pyepp.anchorImage" -}}
{{- $repo := toString (default (default "" .name) .repository) -}}
{{- if regexMatch "(endpoint-picker|inference-scheduler|gateway-api-inference-extension/epp$|^epp$)" $repo -}}true{{- end -}}
{{- end -}}

{{/* dst <- src, recursively for maps; unlike sprig's merge, a false or 0 in src wins. */}}
{{- define "pyepp.mergeInto" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- if and (kindIs "map" $v) (kindIs "map" (index $dst $k)) -}}
{{- include "pyepp.mergeInto" (dict "dst" (index $dst $k) "src" $v) -}}
{{- else -}}
{{- $_ := set $dst $k (deepCopy $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pyepp.normalize" -}}
{{- if not (hasKey .Values "pyeppNormalized") -}}
{{- $v := .Values -}}
{{- $ie := $v.inferenceExtension -}}
{{- $pool := $v.inferencePool -}}
{{- $router := default dict $v.router -}}
{{- $epp := default dict $router.epp -}}
{{- range $k := list "replicas" "flags" "env" "pluginsConfigFile" "extraContainerPorts" "resources" "affinity" "tolerations" "podAnnotations" "extProcPort" "metricsDataSource" "parsers" "volumes" "volumeMounts" "nodeSelector" "podLabels" "imagePullSecrets" -}}
{{- if hasKey $epp $k }}{{ $_ := set $ie $k (index $epp $k) }}{{ end -}}
{{- end -}}
{{- if hasKey $epp "grpcHealthPort" }}{{ $_ := set $ie "healthPort" $epp.grpcHealthPort }}{{ end -}}
{{- with $epp.pluginsCustomConfig }}{{ include "pyepp.mergeInto" (dict "dst" $ie.pluginsCustomConfig "src" .) }}{{ end -}}
{{- with $epp.image }}{{ include "pyepp.mergeInto" (dict "dst" $ie.image "src" .) }}{{ end -}}
{{- /* llm-d's older chart kept the EPP config files under inferencePool. */ -}}
{{- with $pool.pluginsConfigFile }}{{ $_ := set $ie "pluginsConfigFile" . }}{{ end -}}
{{- with $pool.pluginsCustomConfig }}{{ include "pyepp.mergeInto" (dict "dst" $ie.pluginsCustomConfig "src" .) }}{{ end -}}
{{- with $router.modelServers -}}
{{- with .matchLabels }}{{ $_ := set $pool "modelServers" (dict "matchLabels" .) }}{{ end -}}
{{- with .type }}{{ $_ := set $pool "modelServerType" . }}{{ end -}}
{{- with .protocol }}{{ $_ := set $pool "modelServerProtocol" . }}{{ end -}}
{{- with .targetPorts }}{{ $_ := set $pool "targetPorts" . }}{{ end -}}
{{- end -}}
{{- with $router.inferencePool -}}
{{- with .failureMode }}{{ $_ := set $ie "failureMode" . }}{{ end -}}
{{- with .targetPorts }}{{ $_ := set $pool "targetPorts" . }}{{ end -}}
{{- with .apiVersion }}{{ $_ := set $pool "apiVersion" . }}{{ end -}}
{{- end -}}
{{- with $router.monitoring }}{{ include "pyepp.mergeInto" (dict "dst" $v.monitoring "src" .) }}{{ end -}}
{{- with $router.tracing }}{{ include "pyepp.mergeInto" (dict "dst" $ie.tracing "src" .) }}{{ end -}}
{{- with $router.extraServicePorts }}{{ $_ := set $ie "extraServicePorts" . }}{{ end -}}
{{- with $v.extraServicePorts }}{{ $_ := set $ie "extraServicePorts" . }}{{ end -}}
{{- /* GIE's epplib keeps monitoring under inferenceExtension. */ -}}
{{- with $ie.monitoring }}{{ include "pyepp.mergeInto" (dict "dst" $v.monitoring "src" .) }}{{ end -}}
{{- /* llm-d-router's top-level httpRoute (create, ...) is GIE's experimentalHttpRoute (enabled, ...). */ -}}
{{- with $v.httpRoute -}}
{{- $r := $v.experimentalHttpRoute -}}
{{- range $k, $val := . }}{{ if ne $k "create" }}{{ $_ := set $r $k $val }}{{ end }}{{ end -}}
{{- if hasKey . "create" }}{{ $_ := set $r "enabled" .create }}{{ end -}}
{{- end -}}
{{- with $router.inferenceObjectives }}{{ $_ := set $v "inferenceObjectives" . }}{{ end -}}
{{- /* The default config's parser (GIE: inferencePool.parser) and the latency predictor (GIE keeps it under
inferenceExtension, the router chart under router), whose default profile differs between the two charts. */ -}}
{{- if and (hasKey $pool "parser") $pool.parser }}{{ $_ := set $ie "parsers" (list $pool.parser) }}{{ end -}}
{{- with $router.latencyPredictor -}}
{{- $_ := set $ie "latencyPredictor" (mergeOverwrite (deepCopy (default dict $ie.latencyPredictor)) (deepCopy .)) -}}
{{- $_ := set $v "pyeppLatencyVariant" "router" -}}
{{- end -}}
{{- /* Standalone mode (no InferencePool: the EPP selects pods by label): router.inferencePool.create=false, or GIE
standalone's inferenceExtension.endpointsServer.createInferencePool=false (its endpointSelector/targetPorts). */ -}}
{{- $standalone := dict -}}
{{- if and $router.inferencePool (eq (toString $router.inferencePool.create) "false") -}}
{{- $sel := list -}}
{{- range $k, $val := (default dict (default dict $router.modelServers).matchLabels) }}{{ $sel = append $sel (printf "%s=%v" $k $val) }}{{ end -}}
{{- $ports := list -}}
{{- range $pool.targetPorts }}{{ $ports = append $ports (toString .number) }}{{ end -}}
{{- $standalone = dict "selector" (join "," $sel) "ports" (join "," $ports) -}}
{{- end -}}
{{- with $ie.endpointsServer -}}
{{- if eq (toString .createInferencePool) "false" -}}
{{- $standalone = dict "selector" (toString (default "" .endpointSelector)) "ports" (toString (default "8000" .targetPorts)) -}}
{{- with .modelServerType }}{{ $_ := set $pool "modelServerType" . }}{{ end -}}
{{- with .modelServerProtocol }}{{ $_ := set $pool "modelServerProtocol" . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $_ := set $v "pyeppStandalone" $standalone -}}
{{- /* llm-d-router's proxy in front of the EPP (Envoy or agentgateway; sidecar or service mode), resolved once:
the selected preset (router.proxy.presets.<proxyType>, shipped in llm-d-router-standalone's values) under the explicit
router.proxy.* fields. agentgateway talks plaintext gRPC to the EPP, so --secure-serving=false unless set. */ -}}
{{- $proxy := deepCopy (default dict $router.proxy) -}}
{{- $ptype := lower (toString (default "envoy" $proxy.proxyType)) -}}
{{- $pmode := lower (toString (default "sidecar" $proxy.mode)) -}}
{{- if $proxy.enabled -}}
{{- $preset := deepCopy (default dict (index (default dict $proxy.presets) $ptype)) -}}
{{- $resolved := mergeOverwrite $preset (omit (deepCopy $proxy) "presets" "proxyType" "agentgateway") -}}
{{- if not $proxy.args }}{{ $_ := set $resolved "args" (default list $preset.args) }}{{ end -}}
{{- $proxy = $resolved -}}
{{- if eq $ptype "agentgateway" -}}
{{- if not (hasKey $ie.flags "secure-serving") }}{{ $_ := set $ie.flags "secure-serving" false }}{{ end -}}
{{- /* Its first container port is the listener: the EPP Service port named http. */ -}}
{{- $ports := list (dict "name" "http" "containerPort" (int (include "pyepp.proxyListenerPort" $))) -}}
{{- range $i, $port := (default list $proxy.ports) }}{{ if gt $i 0 }}{{ $ports = append $ports $port }}{{ end }}{{ end -}}
{{- $_ := set $proxy "ports" $ports -}}
{{- end -}}
{{- end -}}
{{- $_ := set $v "pyeppProxy" (dict "spec" $proxy "type" $ptype "mode" $pmode "enabled" (and $proxy.enabled true)) -}}
{{- /* The anchors' EPP images run the Go EPP, not this one: keep pyepp's image. */ -}}
{{- if or (include "pyepp.anchorImage" $ie.image) (hasKey $ie.image "hub") -}}
{{- $_ := set $ie "image" (dict "registry" "ghcr.io" "repository" "pyepp/pyepp" "tag" $.Chart.AppVersion "pullPolicy" (default "IfNotPresent" $ie.image.pullPolicy)) -}}
{{- end -}}
{{- $_ := set $v "pyeppNormalized" true -}}
{{- end -}}
{{- end -}}

{{/* The EPP flags the anchors' charts always pass, from the same values, in their order around the flags map
(so, as there, a user flag overrides --zap-encoder but not --tracing / --metrics-endpoint-auth). */}}
{{- define "pyepp.leaderElection" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- if and (gt (int $ie.replicas) 1) (ne (toString $ie.haMode) "active-active") (not (include "pyepp.preferredBackends" .)) }}true{{ end -}}
{{- end -}}

{{/* More than one EPP pod serves or stands by (replicas > 1, or GKE preferred backends): they share in-flight load
and speculative prefix entries through a Redis/Valkey, crossReplica.address or the one the chart deploys. */}}
{{- define "pyepp.sharedState" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $pbs := include "pyepp.preferredBackends" . | fromYamlArray -}}
{{- if or (gt (int $ie.replicas) 1) (gt (len $pbs) 1) }}true{{ end -}}
{{- end -}}

{{- define "pyepp.stateName" -}}
{{- printf "%s-state" (include "pyepp.eppName" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "pyepp.crossReplicaAddress" -}}
{{- $cr := default dict .Values.inferenceExtension.crossReplica -}}
{{- if $cr.address -}}{{ $cr.address }}
{{- else -}}{{ printf "redis://%s.%s.svc:6379" (include "pyepp.stateName" .) .Release.Namespace }}
{{- end -}}
{{- end -}}

{{- define "pyepp.metricsAuth" -}}
{{- $p := .Values.monitoring.prometheus -}}
{{- if or (not (hasKey $p "auth")) (and $p.auth $p.auth.enabled) }}true{{ end -}}
{{- end -}}

{{- define "pyepp.anchorArgsPre" -}}
- --zap-encoder=json
{{- if include "pyepp.leaderElection" . }}
- --ha-enable-leader-election
{{- end }}
{{- end -}}

{{- define "pyepp.anchorArgsPost" -}}
{{- $ie := .Values.inferenceExtension -}}
- --tracing={{ if and $ie.tracing $ie.tracing.enabled }}true{{ else }}false{{ end }}
{{- if and (include "pyepp.sharedState" .) (not (hasKey $ie.flags "cross-replica-address")) }}
- --cross-replica-address={{ include "pyepp.crossReplicaAddress" . }}
{{- end }}
{{- if not (include "pyepp.metricsAuth" .) }}
- --metrics-endpoint-auth=false
{{- end }}
{{- end -}}

{{/* experimentalHttpRoute.headerMatches: GIE's list of HTTPHeaderMatch, or llm-d-router's map {name: value}. */}}
{{- define "pyepp.headerMatches" -}}
{{- $m := .Values.experimentalHttpRoute.headerMatches -}}
{{- if kindIs "map" $m -}}
{{- range $name, $value := $m }}
- type: Exact
  name: {{ $name | quote }}
  value: {{ $value | quote }}
{{- end }}
{{- else if $m -}}
{{ toYaml $m }}
{{- end -}}
{{- end -}}

{{/* Monitoring backend, as both anchors choose it: monitoring.provider.name (llm-d-router: gmp | prometheusoperator),
else gmp (Google Managed Prometheus) when provider.name is gke, else prometheusoperator (a ServiceMonitor). */}}
{{- define "pyepp.monitoringProvider" -}}
{{- $mp := default dict .Values.monitoring.provider -}}
{{- $name := trim (toString (default "" $mp.name)) -}}
{{- if $name -}}{{ lower $name }}
{{- else if eq (lower (toString .Values.provider.name)) "gke" -}}gmp
{{- else -}}prometheusoperator
{{- end -}}
{{- end -}}

{{/* ext_proc target of the anchors' Envoy proxy config. The llm-d-router-standalone values embed these helper
names in router.proxy.presets.envoy.configMap.data (rendered with tpl), so they keep the anchor's names. */}}
{{- define "llm-d-router.proxyMode" -}}{{ .Values.pyeppProxy.mode }}{{- end -}}

{{- define "llm-d-router.proxy.extProcHost" -}}
{{- if eq .Values.pyeppProxy.mode "service" -}}
{{- printf "%s.%s.svc.%s" (include "pyepp.eppName" .) .Release.Namespace (default "cluster.local" (default dict .Values.router).clusterDomain) -}}
{{- else -}}127.0.0.1{{- end -}}
{{- end -}}

{{- define "llm-d-router.proxy.extProcClusterType" -}}
{{- if eq .Values.pyeppProxy.mode "service" }}STRICT_DNS{{ else }}STATIC{{ end -}}
{{- end -}}

{{- define "llm-d-router.proxy.failOpen" -}}
{{- $f := .Values.pyeppProxy.spec.failOpen -}}
{{- if kindIs "bool" $f }}{{ $f }}{{ else }}{{ eq .Values.pyeppProxy.mode "service" }}{{ end -}}
{{- end -}}

{{- define "llm-d-router.proxy.eppSecureServing" -}}
{{- if eq (toString (index (default dict .Values.inferenceExtension.flags) "secure-serving")) "false" }}false{{ else }}true{{ end -}}
{{- end -}}

{{- define "llm-d-router.proxy.envoyExtProcTLSOptions" -}}
{{- if eq (include "llm-d-router.proxy.eppSecureServing" .) "true" -}}
tls_options:
  alpn_protocols: ["h2"]
{{- end -}}
{{- end -}}

{{- define "llm-d-router.proxy.envoyExtProcTransportSocket" -}}
{{- if eq (include "llm-d-router.proxy.eppSecureServing" .) "true" -}}
transport_socket:
  name: "envoy.transport_sockets.tls"
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
    common_tls_context:
      validation_context:
{{- end -}}
{{- end -}}

{{/* The proxy's listener port: the EPP Service port named "http" (router.extraServicePorts). */}}
{{- define "pyepp.proxyListenerPort" -}}
{{- $found := list -}}
{{- range .Values.inferenceExtension.extraServicePorts }}{{ if eq (toString .name) "http" }}{{ $found = append $found . }}{{ end }}{{ end -}}
{{- if ne (len $found) 1 -}}
{{- fail "router.extraServicePorts must contain exactly one port named \"http\" (the proxy's listener) when router.proxy.proxyType=agentgateway" -}}
{{- end -}}
{{- $p := index $found 0 -}}
{{- if not (regexMatch "^[0-9]+$" (toString $p.port)) }}{{ fail (printf "router.extraServicePorts[name=http].port must be a port number, got %v" $p.port) }}{{ end -}}
{{- if and (hasKey $p "targetPort") (ne (toString $p.targetPort) (toString $p.port)) (ne (toString $p.targetPort) "http") -}}
{{- fail (printf "router.extraServicePorts[name=http].targetPort must be omitted, %v or \"http\" when proxyType=agentgateway, got %v" $p.port $p.targetPort) -}}
{{- end -}}
{{- $p.port -}}
{{- end -}}

{{/* agentgateway's config: one listener on the http port that asks the EPP (destinationMode passthrough) and sends
to the model servers' logical service (named after matchLabels.app, else the release). */}}
{{- define "pyepp.agentgatewayConfig" -}}
{{- $app := toString (default .Release.Name (index (default dict .Values.inferencePool.modelServers.matchLabels) "app")) -}}
{{- $ports := list -}}
{{- range .Values.inferencePool.targetPorts }}{{ $ports = append $ports (toString .number) }}{{ end -}}
config:
  statsAddr: "0.0.0.0:15020"
  readinessAddr: "0.0.0.0:15021"
binds:
- port: {{ include "pyepp.proxyListenerPort" . }}
  listeners:
  - name: default
    protocol: HTTP
    routes:
    - name: standalone-epp
      matches:
      - path:
          pathPrefix: /
      backends:
      - service:
          name: {{ printf "%s/%s" .Release.Namespace $app | quote }}
          port: {{ index $ports 0 }}
        policies:
          inferenceRouting:
            endpointPicker:
              host: {{ printf "%s:%v" (include "llm-d-router.proxy.extProcHost" .) .Values.inferenceExtension.extProcPort | quote }}
            destinationMode: passthrough
services:
- name: {{ $app | quote }}
  namespace: {{ .Release.Namespace | quote }}
  hostname: {{ $app | quote }}
  vips: []
  ports:
    {{- range $ports }}
    {{ . }}: {{ . }}
    {{- end }}
{{- end -}}

{{/* One proxy container (llm-d-router's router.proxy, or GIE's inferenceExtension.sidecar), as the anchors render it. */}}
{{- define "pyepp.proxyContainer" -}}
{{- $p := .proxy -}}
- name: {{ required "router.proxy / inferenceExtension.sidecar needs a container name (llm-d-router-standalone's values carry it in router.proxy.presets)" $p.name }}
  image: {{ required "router.proxy / inferenceExtension.sidecar needs an image (llm-d-router-standalone's values carry it in router.proxy.presets)" $p.image }}
  imagePullPolicy: {{ default "IfNotPresent" $p.imagePullPolicy }}
  {{- with $p.command }}
  command:
    - {{ . | quote }}
  {{- end }}
  {{- with $p.args }}
  args:
    {{- range . }}
    - {{ . | quote }}
    {{- end }}
  {{- end }}
  {{- range $k := list "env" "ports" "livenessProbe" "readinessProbe" "startupProbe" "securityContext" "resources" }}
  {{- with index $p $k }}
  {{ $k }}:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- $agw := and .agentgateway (index (default dict $p.configMap) "name") }}
  {{- if or $agw $p.volumeMounts }}
  volumeMounts:
    {{- if $agw }}
    - name: agentgateway-config-template
      mountPath: /config
      readOnly: true
    {{- end }}
    {{- with $p.volumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end -}}

{{/* The pod volumes a proxy container needs (its own, rendered with tpl as the anchors do; agentgateway's config). */}}
{{- define "pyepp.proxyVolumes" -}}
{{- $p := .proxy -}}
{{- if and .agentgateway (index (default dict $p.configMap) "name") }}
- name: agentgateway-config-template
  configMap:
    name: {{ $p.configMap.name }}
    items:
      - key: config.yaml
        path: config.yaml
{{- end }}
{{- with $p.volumes }}
{{ tpl (toYaml .) $.root }}
{{- end }}
{{- end -}}

{{/* llm-d-router's tokenizer sidecar (router.tokenizer): vLLM's `vllm launch render <model>`, serving /render on
loopback for the EPP's token-producer (pyepp's vLLM /render backend; wire it in the EndpointPickerConfig). */}}
{{- define "pyepp.tokenizerContainer" -}}
{{- $port := int (default 8000 .port) -}}
- name: vllm-render
  image: {{ printf "%s/%s:%s" .image.registry .image.repository (toString .image.tag) }}
  imagePullPolicy: {{ default "IfNotPresent" .image.pullPolicy }}
  command:
    {{- toYaml (default (list "vllm" "launch" "render") .command) | nindent 4 }}
  args:
    {{- if .args }}
    {{- toYaml .args | nindent 4 }}
    {{- else }}
    - {{ .modelName | quote }}
    - {{ printf "--port=%d" $port | quote }}
    {{- end }}
    {{- with .extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: render-http
      containerPort: {{ $port }}
  {{- range $k := list "readinessProbe" "env" "resources" }}
  {{- with index $ $k }}
  {{ $k }}:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  volumeMounts:
    - name: model-cache
      mountPath: /root/.cache/huggingface
    {{- with .volumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* GKE preferred backends (llm-d-router: provider.gke.preferredBackends): the EPP runs as a StatefulSet of
preferredReplicas + defaultReplicas pods, each behind its own Service (pod 0 behind <release>-epp, then
-preferred-<i>, -backup, -backup-<j>) with a GCPBackendPolicy pinning it to GKE's PREFERRED or DEFAULT tier; no
leader election (every pod serves). Returns the services as YAML: [{name, policy, pod, preference}] or nothing. */}}
{{- define "pyepp.preferredBackends" -}}
{{- $pb := default dict (default dict .Values.provider.gke).preferredBackends -}}
{{- if and $pb.enabled (eq (lower (toString .Values.provider.name)) "gke") -}}
{{- $pref := int (default 1 $pb.preferredReplicas) -}}
{{- $total := add $pref (int (default 1 $pb.defaultReplicas)) -}}
{{- $epp := include "pyepp.eppName" . -}}
{{- $rel := .Release.Name -}}
{{- range $i := until (int $total) }}
- pod: {{ printf "%s-%d" $epp $i }}
  {{- if eq $i 0 }}
  name: {{ $epp }}
  policy: {{ $rel }}
  preference: PREFERRED
  {{- else if lt $i $pref }}
  name: {{ printf "%s-preferred-%d" $epp $i }}
  policy: {{ printf "%s-preferred-%d" $rel $i }}
  preference: PREFERRED
  {{- else if eq $i $pref }}
  name: {{ printf "%s-backup" $epp }}
  policy: {{ printf "%s-backup" $rel }}
  preference: DEFAULT
  {{- else }}
  name: {{ printf "%s-backup-%d" $epp (sub $i $pref) }}
  policy: {{ printf "%s-backup-%d" $rel (sub $i $pref) }}
  preference: DEFAULT
  {{- end }}
{{- end }}
{{- end -}}
{{- end -}}
