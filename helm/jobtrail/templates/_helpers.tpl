{{- define "jobtrail.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "jobtrail.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "jobtrail.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
Where a component's pods go: its nodeSelector, tolerations and affinity as given, and its pods
spread across nodes (a preference: ScheduleAnyway) so that one node's loss takes few of them,
followed by any topologySpreadConstraints of its own.
*/}}
{{- define "jobtrail.placement" -}}
{{- $v := .values -}}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or $v.spreadAcrossNodes $v.topologySpreadConstraints }}
topologySpreadConstraints:
{{- if $v.spreadAcrossNodes }}
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "jobtrail.selector" (dict "root" .root "component" .component) | nindent 8 }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "jobtrail.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "jobtrail.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (include "jobtrail.fullname" .) .Values.serviceAccount.name }}
{{- else -}}
{{ default "default" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{- define "jobtrail.contractsConfigMap" -}}
{{ default (printf "%s-contracts" (include "jobtrail.fullname" .)) .Values.contracts.existingConfigMap }}
{{- end -}}

{{/* A database URL from the Secret: key, env name. */}}
{{- define "jobtrail.dbEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.database.secretName }}
      key: {{ .key }}
{{- end -}}

{{/* Environment every jobtrail container shares. */}}
{{- define "jobtrail.commonEnv" -}}
- name: JOBTRAIL_LOG_FORMAT
  value: json
- name: JOBTRAIL_PROVIDERS
  value: /etc/jobtrail/providers
- name: JOBTRAIL_DB_POOL
  value: {{ .Values.database.pool | quote }}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: jobtrail
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "jobtrail.volumes" -}}
- name: contracts
  projected:
    sources:
      - configMap:
          name: {{ include "jobtrail.contractsConfigMap" . }}
      {{- if .Values.contracts.schemas }}
      - configMap:
          name: {{ include "jobtrail.fullname" . }}-schemas
          items:
            {{- range $name, $_ := .Values.contracts.schemas }}
            - key: {{ $name }}
              path: schemas/{{ $name }}
            {{- end }}
      {{- end }}
- name: tmp
  emptyDir: {}
{{- if .Values.database.caSecret }}
- name: db-ca
  secret:
    secretName: {{ .Values.database.caSecret }}
{{- end }}
{{- end -}}

{{- define "jobtrail.volumeMounts" -}}
- name: contracts
  mountPath: /etc/jobtrail/providers
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.database.caSecret }}
- name: db-ca
  mountPath: /etc/jobtrail/db-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* The operations a worker could claim now: KEDA's measure of the work. Not those of a provider
the fleet holds back after a 429 (more workers would claim none of them). A contract's
max_in_flight is not in the database: work it holds back still counts. */}}
{{- define "jobtrail.dueQuery" -}}
SELECT count(*) FROM operation_schedule q JOIN operations o ON o.id = q.operation_id WHERE q.next_action_at <= now() AND o.next_action_at <= now() AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now()) AND NOT EXISTS (SELECT 1 FROM provider_throttles t WHERE t.provider = q.provider AND t.paused_until > now())
{{- end -}}


{{/* The provider secrets one component reads: (dict "root" . "component" "worker"|"api"). Each
entry's `component` (worker, the default; api; both) says who gets it: the API never calls a
provider, so provider credentials stay out of its pods; it needs webhook signing secrets. */}}
{{- define "jobtrail.providerSecretEnv" -}}
{{- $component := .component }}
{{- range .root.Values.providerSecrets }}
{{- $for := .component | default "worker" }}
{{- if not (has $for (list "worker" "api" "both")) }}
{{- fail (printf "providerSecrets: %s has component %q: worker, api or both" .name $for) }}
{{- end }}
{{- if or (eq $for $component) (eq $for "both") }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* host:port to listen on, the host from .Values.listenHost (an IPv6 host in brackets). */}}
{{- define "jobtrail.listen" -}}
{{- $host := .root.Values.listenHost -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" (trimAll "[]" $host) (int .port) -}}
{{- else -}}
{{- printf "%s:%d" $host (int .port) -}}
{{- end -}}
{{- end }}

{{/*
A value that may be "off": YAML 1.1 (Helm's values) reads an unquoted `off` as false, which would
render as "false" and stop the API at start; false is taken as "off", true is refused.
*/}}
{{- define "jobtrail.offable" -}}
{{- if kindIs "bool" .value -}}
{{- if .value -}}
{{- fail (printf "%s: true is not a setting; a value (500/s,1000) or \"off\"" .name) -}}
{{- end -}}
off
{{- else -}}
{{- .value -}}
{{- end -}}
{{- end }}

{{/*
The OTLP collector's port, for the workers' NetworkPolicy egress: the one otel.endpoint names, else
its scheme's (80 for http, 443 for https). otelPort, when set, must agree: a policy opening another
port than the exporter dials drops every span in silence.
*/}}
{{- define "jobtrail.otelPort" -}}
{{- $u := urlParse .Values.otel.endpoint -}}
{{- $named := regexFind ":[0-9]+$" $u.host | trimPrefix ":" -}}
{{- $port := $named | default (ternary "443" "80" (eq $u.scheme "https")) -}}
{{- if and .Values.otelPort (ne (toString .Values.otelPort) $port) -}}
{{- fail (printf "otelPort %v is not the port otel.endpoint %s names (%s): the workers' NetworkPolicy would open one port and the exporter dial another; drop otelPort (the endpoint's port is used) or make them agree" .Values.otelPort .Values.otel.endpoint $port) -}}
{{- end -}}
{{- $port -}}
{{- end -}}
