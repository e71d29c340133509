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

{{/* The image that ships the memory-limit hook library: by digest when
one is given (the tag then stays as a label), else by tag. */}}
{{- define "amdgpu-virt.hookImage" -}}
{{- $image := .Values.node.memoryHook.install.image -}}
{{- $image.repository -}}
{{- with $image.tag }}:{{ . }}{{ end -}}
{{- with $image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/* Where the library is staged between the two init containers, or
where the library image is mounted (method imageVolume). */}}
{{- define "amdgpu-virt.hookStaging" -}}
/run/amdgpu-virt-hook
{{- end -}}

{{/* The init containers that install the memory-limit hook library at
node.memoryHook.path (amdgpu-virt k8s install-hook): checked with the
node's own ELF check, written atomically, left alone when unchanged. With
method copy, a first container of the library's image copies it out with
that image's sh and cp (paths are positional arguments, never pasted into
the script); with imageVolume the image is mounted instead. */}}
{{- define "amdgpu-virt.hookInitContainers" -}}
{{- $hook := .Values.node.memoryHook }}
{{- $install := $hook.install }}
{{- $staging := include "amdgpu-virt.hookStaging" . }}
{{- $source := printf "%s/libamvgpu.so" $staging }}
{{- if eq $install.method "imageVolume" }}
{{- $source = printf "%s%s" $staging $install.sourcePath }}
{{- else }}
- name: memory-hook-fetch
  image: {{ include "amdgpu-virt.hookImage" . | quote }}
  imagePullPolicy: {{ $install.image.pullPolicy }}
  command:
    - sh
    - -c
    - >-
      cp -- "$1" "$2" || { echo "cannot copy $1 out of the image $3" >&2;
      test "$4" = optional; }
    - memory-hook-fetch
    - {{ $install.sourcePath | quote }}
    - {{ $source | quote }}
    - {{ include "amdgpu-virt.hookImage" . | quote }}
    - {{ ternary "required" "optional" $install.required }}
  workingDir: {{ $staging }}
  securityContext:
    {{- include "amdgpu-virt.securityContext" . | nindent 4 }}
  {{- with $install.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: memory-hook-staging
      mountPath: {{ $staging }}
{{- end }}
- name: memory-hook-install
  image: {{ include "amdgpu-virt.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - amdgpu-virt
    - k8s
    - install-hook
    - --from
    - {{ $source | quote }}
    - --to
    - {{ $hook.path | quote }}
    - --message-file
    - /dev/termination-log
    {{- if not $install.required }}
    - --best-effort
    {{- end }}
  securityContext:
    # root without capabilities: the library's directory on the host
    # belongs to root
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    runAsUser: 0
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  {{- with $install.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: memory-hook
      mountPath: {{ dir $hook.path }}
    - name: {{ ternary "memory-hook-image" "memory-hook-staging" (eq $install.method "imageVolume") }}
      mountPath: {{ $staging }}
      readOnly: true
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{/* The volumes of those init containers (beside memory-hook and tmp,
which every node pod has). */}}
{{- define "amdgpu-virt.hookVolumes" -}}
{{- $install := .Values.node.memoryHook.install }}
{{- if eq $install.method "imageVolume" }}
- name: memory-hook-image
  image:
    reference: {{ include "amdgpu-virt.hookImage" . | quote }}
    pullPolicy: {{ $install.image.pullPolicy }}
{{- else }}
- name: memory-hook-staging
  emptyDir:
    sizeLimit: 128Mi
{{- end }}
{{- end -}}

{{/* The role ledger file, when ledger.source is file: the ledger
ConfigMap mounted as a volume (kubelet refreshes it in place). */}}
{{- define "amdgpu-virt.ledgerDir" -}}
/etc/amdgpu-virt-ledger
{{- end -}}

{{- define "amdgpu-virt.ledgerMount" -}}
{{- if eq .Values.ledger.source "file" }}
- name: ledger
  mountPath: {{ include "amdgpu-virt.ledgerDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "amdgpu-virt.ledgerVolume" -}}
{{- if eq .Values.ledger.source "file" }}
{{- if ne .Values.ledger.configMap.namespace .Release.Namespace }}
{{- fail (printf "ledger.source=file mounts the ConfigMap ledger.configMap, which must then be in the release namespace %s, not %s; use ledger.source=configmap for a ConfigMap of another namespace" .Release.Namespace .Values.ledger.configMap.namespace) }}
{{- end }}
- name: ledger
  configMap:
    name: {{ .Values.ledger.configMap.name }}
    # a missing ConfigMap: the pods start and offer no GPU until it exists
    optional: true
{{- end }}
{{- end -}}
