"""Sphinx configuration of the amdgpu_virt release notes."""

project = 'amdgpu_virt Release Notes'
copyright = 'amdgpu_virt developers'  # noqa: A001
extensions = ['reno.sphinxext']
master_doc = 'index'
exclude_patterns: list[str] = []
html_theme = 'alabaster'
pygments_style = 'sphinx'
