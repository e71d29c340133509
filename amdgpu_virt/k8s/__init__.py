"""Kubernetes driver: node agent, extender, device plugin, webhook."""
