{{/* The release's full name (63 characters at most). */}}
{{- define "krl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "krl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "krl.labels" -}}
{{ include "krl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "krl.leaseName" -}}
{{- .Values.lease.name | default (include "krl.fullname" .) -}}
{{- end -}}

{{- define "krl.serviceName" -}}
{{- printf "%s-webhook" (include "krl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "krl.tlsSecretName" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-webhook-tls" (include "krl.fullname" .)) -}}
{{- end -}}

{{/*
The library's LeaseConfig::shutdown_budget(shutdownGrace), in seconds:
grace + 2 x renew deadline + release timeout (5 s) + retry period, + 10 s
(the LeaseCandidate's deletion) when coordinated. kube-runtime-lease's
src/config/mod.rs; tests/tests/chart.rs holds this to it.
*/}}
{{- define "krl.shutdownBudget" -}}
{{- $l := .Values.lease -}}
{{- $budget := addf .Values.shutdownGrace (mulf 2 $l.renewDeadline) 5 $l.retryPeriod -}}
{{- if $l.coordinated.enabled -}}
{{- $budget = addf $budget 10 -}}
{{- end -}}
{{- $budget -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the budget rounded up, plus the margin. */}}
{{- define "krl.terminationGrace" -}}
{{- $budget := include "krl.shutdownBudget" . | float64 -}}
{{- add (ceil $budget | int) (.Values.terminationGraceMargin | int) -}}
{{- end -}}

{{/* What the program refuses at start, refused at install instead. */}}
{{- define "krl.validate" -}}
{{- $l := .Values.lease -}}
{{- $budget := include "krl.shutdownBudget" . | float64 -}}
{{- if not (gt (float64 $l.duration) (float64 $l.renewDeadline)) -}}
{{- fail (printf "lease.duration (%v) must be longer than lease.renewDeadline (%v)" $l.duration $l.renewDeadline) -}}
{{- end -}}
{{- if not (gt (float64 $l.renewDeadline) (float64 $l.retryPeriod)) -}}
{{- fail (printf "lease.renewDeadline (%v) must be longer than lease.retryPeriod (%v)" $l.renewDeadline $l.retryPeriod) -}}
{{- end -}}
{{- if not (gt (float64 $l.retryPeriod) 0.0) -}}
{{- fail "lease.retryPeriod must be positive" -}}
{{- end -}}
{{- if gt (float64 .Values.webhook.drainTimeout) (float64 .Values.shutdownGrace) -}}
{{- fail (printf "webhook.drainTimeout (%v) is longer than shutdownGrace (%v)" .Values.webhook.drainTimeout .Values.shutdownGrace) -}}
{{- end -}}
{{- if gt (addf .Values.webhook.drainDelay .Values.webhook.drainTimeout) $budget -}}
{{- fail (printf "webhook.drainDelay + webhook.drainTimeout do not fit the shutdown budget (%v s)" $budget) -}}
{{- end -}}
{{- if lt (int .Values.terminationGraceMargin) 0 -}}
{{- fail "terminationGraceMargin must not be negative" -}}
{{- end -}}
{{- end -}}
