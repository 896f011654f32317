{{- define "pyepp.validate" -}}
{{- if .Values.pyeppStandalone -}}
{{- if not .Values.pyeppStandalone.selector -}}
{{- fail "standalone mode (router.inferencePool.create=false, or inferenceExtension.endpointsServer.createInferencePool=false) needs the model servers' labels: router.modelServers.matchLabels, or inferenceExtension.endpointsServer.endpointSelector" -}}
{{- end -}}
{{- if $.Values.inferenceObjectives -}}
{{- fail "inferenceObjectives can only be configured with an InferencePool (not with router.inferencePool.create=false)" -}}
{{- end -}}
{{- else if not .Values.inferencePool.modelServers.matchLabels -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels that select this pool's model server pods" -}}
{{- end -}}
{{- $router := default dict .Values.router -}}
{{- $tok := default dict $router.tokenizer -}}
{{- if and $tok.enabled (not $tok.modelName) -}}
{{- fail "router.tokenizer.modelName is required when the tokenizer is enabled" -}}
{{- end -}}
{{- $proxy := .Values.pyeppProxy -}}
{{- if not (has $proxy.mode (list "sidecar" "service")) -}}
{{- fail (printf "router.proxy.mode must be one of [sidecar, service], got %q" $proxy.mode) -}}
{{- end -}}
{{- $failOpen := index (default dict $router.proxy) "failOpen" -}}
{{- if and (not (kindIs "invalid" $failOpen)) (not (kindIs "bool" $failOpen)) -}}
{{- fail (printf "router.proxy.failOpen must be a boolean, got %q" (toString $failOpen)) -}}
{{- end -}}
{{- if and (eq $proxy.mode "service") (not $proxy.enabled) -}}
{{- fail "router.proxy.enabled must be true when router.proxy.mode=service" -}}
{{- end -}}
{{- if $proxy.enabled -}}
{{- if not (has $proxy.type (list "envoy" "agentgateway")) -}}
{{- fail (printf "router.proxy.proxyType must be one of [envoy, agentgateway], got %q" $proxy.type) -}}
{{- end -}}
{{- if eq $proxy.mode "service" -}}
{{- $http := false -}}
{{- range .Values.inferenceExtension.extraServicePorts }}{{ if eq (toString .name) "http" }}{{ $http = true }}{{ end }}{{ end -}}
{{- if not $http }}{{ fail "router.extraServicePorts must contain a port named \"http\" for the proxy listener when router.proxy.mode=service" }}{{ end -}}
{{- end -}}
{{- if eq $proxy.type "agentgateway" -}}
{{- if hasKey (default dict $router.proxy) "agentgateway" -}}
{{- fail "router.proxy.agentgateway is no longer supported; standalone agentgateway uses EPP endpoint discovery with a logical service backend" -}}
{{- end -}}
{{- if not .Values.pyeppStandalone -}}
{{- fail "router.inferencePool.create=false is required when router.proxy.proxyType=agentgateway (agentgateway supports only service-backed routing)" -}}
{{- end -}}
{{- if ne (include "llm-d-router.proxy.eppSecureServing" .) "false" -}}
{{- fail "router.epp.flags.secure-serving must be false when router.proxy.proxyType=agentgateway (agentgateway talks plaintext gRPC to the EPP)" -}}
{{- end -}}
{{- $_ := include "pyepp.proxyListenerPort" . -}}
{{- end -}}
{{- end -}}
{{- $pb := default dict (default dict .Values.provider.gke).preferredBackends -}}
{{- if $pb.enabled -}}
{{- if lt (int (default 1 $pb.preferredReplicas)) 1 }}{{ fail "provider.gke.preferredBackends.preferredReplicas must be at least 1 when preferredBackends.enabled is true" }}{{ end -}}
{{- if lt (int (default 1 $pb.defaultReplicas)) 1 }}{{ fail "provider.gke.preferredBackends.defaultReplicas must be at least 1 when preferredBackends.enabled is true" }}{{ end -}}
{{- if .Values.pyeppStandalone }}{{ fail "provider.gke.preferredBackends needs an InferencePool (not router.inferencePool.create=false)" }}{{ end -}}
{{- end -}}
{{- if and (not .Values.pyeppStandalone) (ne (toString .Values.inferencePool.apiVersion) "inference.networking.k8s.io/v1") -}}
{{- fail (printf "inferencePool.apiVersion %s is not rendered: this chart renders the GA InferencePool (inference.networking.k8s.io/v1), as GIE v1.5's and llm-d-router's charts do; the pre-GA v1alpha2 pool has another schema (remove the value to get v1)" (toString .Values.inferencePool.apiVersion)) -}}
{{- end -}}
{{- $ports := .Values.inferencePool.targetPorts -}}
{{- if or (lt (len $ports) 1) (gt (len $ports) 8) -}}
{{- fail "inferencePool.targetPorts must list 1 to 8 ports" -}}
{{- end -}}
{{- if not (has .Values.inferencePool.modelServerProtocol (list "http" "grpc")) -}}
{{- fail "inferencePool.modelServerProtocol must be http or grpc" -}}
{{- end -}}
{{- if not (has .Values.inferenceExtension.failureMode (list "FailOpen" "FailClose")) -}}
{{- fail "inferenceExtension.failureMode must be FailOpen or FailClose" -}}
{{- end -}}
{{- end -}}
