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
{{- /* client-go's rule, as LeaseConfig::validate: renew deadline > 1.2 x retry period (the jitter). */ -}}
{{- if not (gt (float64 $l.renewDeadline) (mulf 1.2 $l.retryPeriod)) -}}
{{- fail (printf "lease.renewDeadline (%v) must be longer than lease.retryPeriod (%v) x 1.2 (the jitter factor)" $l.renewDeadline $l.retryPeriod) -}}
{{- end -}}
{{- if not (gt (float64 $l.retryPeriod) 0.0) -}}
{{- fail "lease.retryPeriod must be positive" -}}
{{- end -}}
{{- /* leaseDurationSeconds is an int32: whole seconds only. */ -}}
{{- if or (ne (float64 $l.duration) (floor $l.duration)) (gt (float64 $l.duration) 2147483647.0) -}}
{{- fail (printf "lease.duration (%v) must be a whole number of seconds, at most 2147483647" $l.duration) -}}
{{- end -}}
{{- /* The Lease's name, also the value of its app.kubernetes.io/name label: a
DNS-1123 subdomain of at most 63 characters. */ -}}
{{- $lease := include "krl.leaseName" . -}}
{{- if or (gt (len $lease) 63) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $lease)) -}}
{{- fail (printf "lease.name %q must be a DNS-1123 subdomain of at most 63 characters (it is also the Lease's app.kubernetes.io/name label)" $lease) -}}
{{- end -}}
{{- range $name, $v := dict "shutdownGrace" .Values.shutdownGrace "webhook.drainDelay" .Values.webhook.drainDelay "webhook.drainTimeout" .Values.webhook.drainTimeout -}}
{{- if or (lt (float64 $v) 0.0) (gt (float64 $v) 2147483647.0) -}}
{{- fail (printf "%s (%v) must be between 0 and 2147483647 seconds" $name $v) -}}
{{- end -}}
{{- end -}}
{{- if $l.coordinated.enabled -}}
{{- $semver := "^(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\\+[0-9A-Za-z.-]+)?$" -}}
{{- $binary := toString $l.coordinated.binaryVersion -}}
{{- $emulation := toString ($l.coordinated.emulationVersion | default $binary) -}}
{{- range $name, $v := dict "lease.coordinated.binaryVersion" $binary "lease.coordinated.emulationVersion" $emulation -}}
{{- if not (regexMatch $semver $v) -}}
{{- fail (printf "%s (%q) must be a semantic version MAJOR.MINOR.PATCH, such as 1.37.0" $name $v) -}}
{{- end -}}
{{- end -}}
{{- if gt ((semver $emulation).Compare (semver $binary)) 0 -}}
{{- fail (printf "lease.coordinated.emulationVersion (%s) must not be newer than lease.coordinated.binaryVersion (%s)" $emulation $binary) -}}
{{- end -}}
{{- end -}}
{{- if gt (float64 .Values.webhook.drainTimeout) (float64 .Values.shutdownGrace) -}}
{{- fail (printf "webhook.drainTimeout (%v) is longer than shutdownGrace (%v)" .Values.webhook.drainTimeout .Values.shutdownGrace) -}}
{{- end -}}
{{- if gt (addf .Values.webhook.drainDelay .Values.webhook.drainTimeout) $budget -}}
{{- fail (printf "webhook.drainDelay + webhook.drainTimeout do not fit the shutdown budget (%v s)" $budget) -}}
{{- end -}}
{{- /* The webhook's Service is named after the release: a DNS-1035 label. */ -}}
{{- $svc := include "krl.serviceName" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $svc) -}}
{{- fail (printf "the release name %q gives the webhook's Service the name %q, which is no DNS-1035 label (a letter first, no dots): choose a release name that starts with a letter and has no dots" .Release.Name $svc) -}}
{{- end -}}
{{- if lt (int .Values.terminationGraceMargin) 0 -}}
{{- fail "terminationGraceMargin must not be negative" -}}
{{- end -}}
{{- end -}}

{{/*
An upgrade must not change the Lease the running replicas elect on: during
the rolling update, the old replicas would keep leading the old Lease while
a new one leads the new Lease (at once if it exists and is free, else after
its creation hold; for as long as the rollout lasts or stalls), and both
would do the guarded work. Refused while the Deployment has replicas: scale
it to 0 first (replicas=0), then change lease.name.
*/}}
{{- define "krl.validateUpgrade" -}}
{{- $running := lookup "apps/v1" "Deployment" .Release.Namespace (include "krl.fullname" .) -}}
{{- if $running -}}
{{- $old := "" -}}
{{- range $c := $running.spec.template.spec.containers -}}
{{- if eq $c.name "operator" -}}
{{- range $e := $c.env | default list -}}
{{- if eq $e.name "LEASE_NAME" -}}
{{- $old = $e.value | default "" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $new := include "krl.leaseName" . -}}
{{- $replicas := add (int ($running.spec.replicas | default 0)) (int (($running.status | default dict).replicas | default 0)) -}}
{{- if and $old (ne $old $new) (gt (int $replicas) 0) -}}
{{- fail (printf "lease.name: the running replicas elect on the Lease %q; changing it to %q in a rolling update would let an old and a new replica lead at once (two leaders). Scale to 0 first (replicas=0), then change it" $old $new) -}}
{{- end -}}
{{- end -}}
{{- end -}}
