"""Talking to the API server: clients, errors, label values, HTTP serving.

Face: :mod:`.client` (clients from the ``[kubernetes]`` options and
:func:`~.client.call`, the one place transport and API errors become the
project's), :mod:`.labels` (label values), :mod:`.namespaces` (namespace
labels, cached), :mod:`.quantity` (resource quantities, parsed and
written by Kubernetes' rules), :mod:`.events` (Events on a Node),
:mod:`.watch` (list-and-watch threads) and :mod:`.httpserver` (the server
for hostile clients that the webhook, the extender and the node metrics
share, with its connection policy :mod:`.connpolicy`, its certificates
:mod:`.tls` and its request bodies :mod:`.httpbody`). Every component may
import it; it imports no component.
"""

__all__ = ['client', 'connpolicy', 'events', 'httpbody', 'httpserver',
           'labels', 'namespaces', 'quantity', 'tls', 'watch']
