"""The node side: registration, labels and the kubelet device plugin.

Face: :mod:`.agent` (the node agent), :mod:`.deviceplugin` (the kubelet
device plugin), :mod:`.devices` (a node's GPU units and what a container
gets), :mod:`.health` (GPU health checks), :mod:`.memhook` (is the
memory-limit library usable), :mod:`.roles` (which GPUs the role ledger
gives to Kubernetes), :mod:`.enforcement` (each GPU's memory enforcement
level), :mod:`.cgroups` and :mod:`.dmem` (kubelet's cgroups, kernel VRAM
caps) and :mod:`.ocihook` (the caps of a container, from a runtime hook).
:mod:`.hookinstall` puts the memory-limit library on the node
(``amdgpu-virt k8s install-hook``). Inside: :mod:`.sharedpick`,
:mod:`.sharedalloc` and :mod:`.sharedserve` (Allocate for booked pods),
:mod:`.podcaps` (the pod caps of PreStartContainer), :mod:`.podsource`
(the node's pods and lock), :mod:`.labels` (AMD's node labels), :mod:`.dme`
(AMD's exporter), :mod:`.healthpublish` (the node's health label,
condition and Events), :mod:`.telemetry`, :mod:`.attribution` and
:mod:`.metricsserver` (the node's metrics). The
DRA driver and the consumer view may import the face; the scheduler and
the webhook may not.
"""

__all__ = ['agent', 'cgroups', 'deviceplugin', 'devices', 'dmem',
           'enforcement', 'health', 'memhook', 'ocihook', 'roles']
