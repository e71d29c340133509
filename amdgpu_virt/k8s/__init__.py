"""Kubernetes driver: node agent, extender, device plugin, webhook.

The only package that imports ``kubernetes`` and ``grpc``.
"""
