{{/* Names shared by every template. The object names are fixed: the
admission policies name the service accounts, and the code reads the
ConfigMaps by name. */}}

{{- define "amdgpu-virt.labels" -}}
app.kubernetes.io/part-of: amdgpu-virt
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "amdgpu-virt.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* system:serviceaccount:<ns>:<name> of the project's accounts */}}
{{- define "amdgpu-virt.schedulerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:amdgpu-virt-scheduler
{{- end -}}
{{- define "amdgpu-virt.nodeUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:amdgpu-virt-node
{{- end -}}

{{/* The securityContext of every amdgpu-virt container */}}
{{- define "amdgpu-virt.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* HAMi's pod allocation annotations (amdgpu_virt.sharing.hami), as a
CEL list literal */}}
{{- define "amdgpu-virt.allocationAnnotations" -}}
['hami.io/amd-devices-to-allocate', 'hami.io/amd-devices-allocated', 'hami.io/amd-cu-allocated', 'hami.io/vgpu-node', 'hami.io/vgpu-time', 'hami.io/bind-phase', 'hami.io/bind-time']
{{- end -}}

{{- /* HAMi's allocation labels on pods (amdgpu_virt.sharing.hami.ALLOCATION_LABELS). */}}
{{- define "amdgpu-virt.allocationLabels" -}}
['hami.io/vgpu-node']
{{- end -}}

{{- define "amdgpu-virt.configPath" -}}
/etc/amdgpu_virt/amdgpu-virt.conf
{{- end -}}
