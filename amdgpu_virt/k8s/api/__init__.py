"""Talking to the API server: clients, errors, label values, HTTP serving.

Face: :mod:`.client` (clients from the ``[kubernetes]`` options and
:func:`~.client.call`, the one place transport and API errors become the
project's), :mod:`.labels` (label values), :mod:`.watch` (list-and-watch
threads) and :mod:`.httpserver` (the server for hostile clients that the
webhook and the extender share, with its connection policy
:mod:`.connpolicy`, its certificates :mod:`.tls` and its request bodies
:mod:`.httpbody`). Every component may import it; it imports no
component.
"""

__all__ = ['client', 'connpolicy', 'httpbody', 'httpserver', 'labels', 'tls',
           'watch']
