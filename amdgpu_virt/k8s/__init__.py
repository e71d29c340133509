"""Kubernetes driver: node agent, scheduler extender, device plugin, webhook."""
