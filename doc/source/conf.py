"""Sphinx configuration of the amdgpu_virt documentation."""

project = 'amdgpu_virt'
copyright = 'amdgpu_virt developers'  # noqa: A001
extensions = [
    'sphinx.ext.autodoc',
    'oslo_config.sphinxext',
    'reno.sphinxext',
]
master_doc = 'index'
exclude_patterns: list[str] = []
html_theme = 'alabaster'
pygments_style = 'sphinx'
