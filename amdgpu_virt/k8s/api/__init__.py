"""Talking to the API server: clients, errors, label values, HTTP serving.

Face: :mod:`.client` (clients from the ``[kubernetes]`` options and
:func:`~.client.call`, the one place transport and API errors become the
project's), :mod:`.labels` (label values), :mod:`.namespaces` (namespace
labels, cached), :mod:`.quantity` (resource quantities, parsed and
written by Kubernetes' rules), :mod:`.events` (Events on a Node) and
:mod:`.httpserver` (the server for hostile clients that the webhook, the
extender and the node metrics share). Every component may import it; it
imports no component.
"""

__all__ = ['client', 'events', 'httpserver', 'labels', 'namespaces',
           'quantity']
