{{- define "pyepp.validate" -}}
{{- if not .Values.inferencePool.modelServers.matchLabels -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels that select this pool's model server pods" -}}
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
