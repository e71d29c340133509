"""The node side: registration, labels and the kubelet device plugin.

Face: :mod:`.agent` (the node agent), :mod:`.deviceplugin` (the kubelet
device plugin), :mod:`.devices` (a node's GPU units and what a container
gets), :mod:`.health` (GPU health checks), :mod:`.memhook` (is the
memory-limit library usable) and :mod:`.roles` (which GPUs the role ledger
gives to Kubernetes). :mod:`.hookinstall` puts the memory-limit library
on the node (``amdgpu-virt k8s install-hook``). Inside: :mod:`.sharedpick`,
:mod:`.sharedalloc` and :mod:`.sharedserve` (Allocate for booked pods),
:mod:`.podsource` (the node's pods and lock), :mod:`.labels` (AMD's node
labels), :mod:`.dme` (AMD's exporter), :mod:`.healthpublish` (the node's
health label, condition and Events), :mod:`.telemetry`,
:mod:`.attribution` and :mod:`.metricsserver` (the node's metrics). The
DRA driver and the consumer view may import the face; the scheduler and
the webhook may not.
"""

__all__ = ['agent', 'deviceplugin', 'devices', 'health', 'memhook',
           'roles']
