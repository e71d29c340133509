"""The Kubernetes side: one sub-package per component.

* :mod:`.api`: the ``kubernetes`` client and its errors, label values, the
  hardened HTTP server (imports no component);
* :mod:`.record`: the allocation record, its store and sweep, the node lock
  and the role ledger ConfigMap: the state the extender, the device plugin
  and ``apply`` share in the API;
* :mod:`.fit`: what a pod asks, what a node offers and holds, where a pod
  fits (pure);
* :mod:`.scheduler`: the kube-scheduler extender and its cache;
* :mod:`.admission`: the mutating webhook and its rules;
* :mod:`.node`: the node agent, the kubelet device plugin and what it
  serves;
* :mod:`.dra`: the Dynamic Resource Allocation driver;
* :mod:`.pool`: who uses which GPU, for ``move``, ``audit`` and ``plan``;
* :mod:`.proto`: generated gRPC code of the kubelet APIs.

``admission``, ``scheduler`` and ``node`` never import each other; they
share ``record``, ``fit`` and ``api`` (contracts in ``.importlinter``).
The only package that imports ``kubernetes`` and ``grpc``.
"""
