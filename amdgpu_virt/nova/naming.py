"""Names amdgpu_virt gives GPUs in Nova and Placement (pure).

Scheme (defaults; every template is an option of the ``[nova]`` group;
see the Nova admin guide for the table):

* VF resource class ``CUSTOM_AMD_{model}_{compute_mode}_VF``
  (``CUSTOM_AMD_MI300X_CPX_VF``); whole GPU ``CUSTOM_AMD_{model}``;
* traits ``<prefix>MODEL_{model}``, and for VFs ``<prefix>PARTITION_{mode}``
  and ``<prefix>MEMORY_{nps}`` (prefix ``CUSTOM_AMD_``);
* aliases ``amd-{model}-{compute_mode}-vf`` and ``amd-{model}``;
* per-GPU trait ``<prefix>GPU_<n>`` (``n``: the GPU's rank by PCI address
  among the host's AMD GPUs, from 0) and per-GPU aliases ``<alias>-gpu<n>``
  requiring it, so that a request group of a wide flavor matches exactly
  one provider of a host (``[nova] per_gpu_traits``).

``{model}`` is the catalog name with every run of characters other than
letters and digits replaced by ``_`` (``MI300X HF`` -> ``MI300X_HF``,
``MI250X/MI250`` -> ``MI250X_MI250``); upper case in Placement names, lower
case (with ``-``) in alias names. Placement accepts custom names matching
``^CUSTOM_[A-Z0-9_]+$`` up to 255 characters; Nova splits traits on commas
without trimming, so names never contain spaces or commas.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception

CUSTOM_NAME_RE = re.compile(r'^CUSTOM_[A-Z0-9_]+$')
MAX_CUSTOM_NAME = 255
ALIAS_NAME_RE = re.compile(r'^[a-z0-9][a-z0-9._-]*$')
MAX_ALIAS_NAME = 256
_SLUG_RE = re.compile(r'[^A-Za-z0-9]+')


def slug(text: str) -> str:
    """``MI300X HF`` -> ``MI300X_HF`` (upper case, ``_`` separated)."""
    return _SLUG_RE.sub('_', text).strip('_').upper()


def check_custom_name(name: str, what: str, host: str = '-') -> str:
    """Return ``name`` if Placement accepts it as a custom name.

    :raises NovaConfigError: naming ``what`` and the bad name.
    """
    if len(name) > MAX_CUSTOM_NAME or not CUSTOM_NAME_RE.match(name):
        raise exception.NovaConfigError(
            host=host, reason='%s %r is not a valid Placement custom name '
            '(^CUSTOM_[A-Z0-9_]+$, at most %d characters)' % (
                what, name, MAX_CUSTOM_NAME))
    return name


def _fill(template: str, option: str, fields: dict[str, Any]) -> str:
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
        raise exception.ConfigError(
            option='[nova] %s' % option,
            reason='template %r cannot be filled (%s); fields: %s' % (
                template, err, ', '.join(sorted(fields)))) from None


@dataclasses.dataclass(frozen=True)
class Naming:
    """The naming templates, validated once."""

    vf_resource_class_template: str = 'CUSTOM_AMD_{model}_{compute_mode}_VF'
    dedicated_resource_class_template: str = 'CUSTOM_AMD_{model}'
    trait_prefix: str = 'CUSTOM_AMD_'
    vf_alias_template: str = 'amd-{model}-{compute_mode}-vf'
    dedicated_alias_template: str = 'amd-{model}'
    per_gpu_traits: bool = True

    def __post_init__(self) -> None:
        if not self.trait_prefix.startswith('CUSTOM_') or not \
                CUSTOM_NAME_RE.match(self.trait_prefix + 'X'):
            raise exception.ConfigError(
                option='[nova] trait_prefix',
                reason='%r must start with CUSTOM_ and contain only A-Z, 0-9 '
                'and _' % self.trait_prefix)
        # Fill every template once with sample values so that a bad
        # template fails at start-up, naming its option.
        self.vf_resource_class('MI300X', 'CPX', 'NPS4', 8)
        self.dedicated_resource_class('MI300X')
        self.vf_alias('MI300X', 'CPX', 'NPS4', 8)
        self.dedicated_alias('MI300X')

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> Naming:
        group = conf.nova
        return cls(
            vf_resource_class_template=group.vf_resource_class_template,
            dedicated_resource_class_template=(
                group.dedicated_resource_class_template),
            trait_prefix=group.trait_prefix,
            vf_alias_template=group.vf_alias_template,
            dedicated_alias_template=group.dedicated_alias_template,
            per_gpu_traits=group.per_gpu_traits)

    @staticmethod
    def _fields(model: str, compute_mode: str = '', memory_mode: str = '',
                vf_count: int = 0) -> dict[str, Any]:
        return {'model': slug(model), 'compute_mode': compute_mode.upper(),
                'memory_mode': memory_mode.upper(), 'vf_count': vf_count}

    def _rc(self, option: str, template: str, fields: dict[str, Any]) -> str:
        name = _fill(template, option, fields)
        if len(name) > MAX_CUSTOM_NAME or not CUSTOM_NAME_RE.match(name):
            raise exception.ConfigError(
                option='[nova] %s' % option,
                reason='%r gives %r, not a valid Placement custom name '
                '(^CUSTOM_[A-Z0-9_]+$, at most %d characters)' % (
                    template, name, MAX_CUSTOM_NAME))
        return name

    def _alias(self, option: str, template: str,
               fields: dict[str, Any]) -> str:
        lower = {k: (v.lower().replace('_', '-') if isinstance(v, str)
                     else v) for k, v in fields.items()}
        name = _fill(template, option, lower)
        if len(name) > MAX_ALIAS_NAME or not ALIAS_NAME_RE.match(name):
            raise exception.ConfigError(
                option='[nova] %s' % option,
                reason='%r gives alias name %r; use lower case letters, '
                'digits, ".", "_" and "-" (at most %d characters)' % (
                    template, name, MAX_ALIAS_NAME))
        return name

    def vf_resource_class(self, model: str, compute_mode: str,
                          memory_mode: str, vf_count: int) -> str:
        return self._rc('vf_resource_class_template',
                        self.vf_resource_class_template,
                        self._fields(model, compute_mode, memory_mode,
                                     vf_count))

    def dedicated_resource_class(self, model: str) -> str:
        return self._rc('dedicated_resource_class_template',
                        self.dedicated_resource_class_template,
                        self._fields(model))

    def vf_alias(self, model: str, compute_mode: str, memory_mode: str,
                 vf_count: int) -> str:
        return self._alias('vf_alias_template', self.vf_alias_template,
                           self._fields(model, compute_mode, memory_mode,
                                        vf_count))

    def dedicated_alias(self, model: str) -> str:
        return self._alias('dedicated_alias_template',
                           self.dedicated_alias_template,
                           self._fields(model))

    def traits(self, model: str, compute_mode: str | None = None,
               memory_mode: str | None = None) -> tuple[str, ...]:
        """Sorted custom traits of a GPU provider."""
        names = [self.trait_prefix + 'MODEL_' + slug(model)]
        if compute_mode:
            names.append(self.trait_prefix + 'PARTITION_' + slug(
                compute_mode))
        if memory_mode:
            names.append(self.trait_prefix + 'MEMORY_' + slug(memory_mode))
        for name in names:
            check_custom_name(name, 'trait')
        return tuple(sorted(names))

    def gpu_trait(self, index: int) -> str:
        """The trait of the ``index``-th GPU of a host (by PCI address)."""
        name = '%sGPU_%d' % (self.trait_prefix, index)
        check_custom_name(name, 'trait')
        return name


def gpu_alias(alias: str, index: int) -> str:
    """The alias of ``alias``'s devices on the ``index``-th GPU only.

    :raises ConfigError: the name would be too long for Nova.
    """
    name = '%s-gpu%d' % (alias, index)
    if len(name) > MAX_ALIAS_NAME or not ALIAS_NAME_RE.match(name):
        raise exception.ConfigError(
            option='alias %s' % alias,
            reason='per-GPU alias %r is not a valid alias name (at most '
            '%d characters)' % (name, MAX_ALIAS_NAME))
    return name


def provider_name(node: str, address: str) -> str:
    """Placement provider name Nova gives a PCI device of ``node``."""
    return '%s_%s' % (node, address.upper())
