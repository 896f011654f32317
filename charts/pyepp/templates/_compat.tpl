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
{{- if and (gt (int $ie.replicas) 1) (ne (toString $ie.haMode) "active-active") }}true{{ end -}}
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
