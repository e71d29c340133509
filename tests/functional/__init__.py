"""Functional tests: real servers and stand-ins on 127.0.0.1.

The servers run in the test process, and their libraries log every
request and decision at INFO or DEBUG (Placement's request log,
oslo.policy's rule checks, keystoneauth's and urllib3's connections,
stevedore's plugin scans, Nova's API and database layers): kept to
warnings here, so that what a test run prints is its failures. A test
that needs one of these logs captures it (``fixtures.FakeLogger(name=...,
level=...)``), which sets the level it asks for.
"""

from __future__ import annotations

import logging

#: the loggers of the servers and clients the tests run in-process
NOISY = ('placement', 'nova', 'oslo_policy', 'oslo_db', 'oslo.privsep',
         'oslo_concurrency', 'oslo_messaging', 'keystoneauth',
         'keystonemiddleware', 'openstack', 'urllib3', 'requests',
         'stevedore', 'kubernetes', 'migrate', 'alembic', 'sqlalchemy',
         'routes', 'webob', 'grpc')

for _name in NOISY:
    logging.getLogger(_name).setLevel(logging.WARNING)
