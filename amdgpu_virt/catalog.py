"""The AMD Instinct model table.

Facts come from public sources (Linux amdgpu/amdkfd, libdrm ``amdgpu.ids``,
pci.ids, ROCm and MxGPU/GIM documentation); values the sources do not give are
None. pci.ids lacks several of these ids, so the project ships its own table.

Partition modes map each compute mode to the memory (NPS) modes it may be
combined with. VF counts are the ones AMD's GIM host driver officially
supports; a VF count also fixes the spatial mode (1 SPX, 2 DPX, 4 QPX, 8 CPX).
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from amdgpu_virt import exception
from amdgpu_virt.model import GpuModel

GIB_MIB = 1024

#: PCI class codes an AMD Instinct function may report: display controller
#: (0x03xxxx) on MI200, processing accelerator (0x12xxxx) on MI300 and later.
GPU_CLASS_PREFIXES = (0x03, 0x12)

#: VF count -> compute (spatial) mode under GIM.
VF_COUNT_MODES: Mapping[int, str] = types.MappingProxyType(
    {1: 'SPX', 2: 'DPX', 4: 'QPX', 8: 'CPX'})

#: Compute mode -> number of partitions (TPX only on 6-XCD parts).
PARTITIONS_PER_MODE: Mapping[str, int] = types.MappingProxyType(
    {'SPX': 1, 'DPX': 2, 'TPX': 3, 'QPX': 4})

_XCD8_CDNA3 = (('SPX', ('NPS1',)), ('DPX', ('NPS1', 'NPS2')),
               ('QPX', ('NPS1', 'NPS4')), ('CPX', ('NPS1', 'NPS4')))
_XCD6_APU = (('SPX', ('NPS1',)), ('TPX', ('NPS1',)), ('CPX', ('NPS1',)))
_XCD4_CDNA3 = (('SPX', ('NPS1',)), ('DPX', ('NPS1', 'NPS2')),
               ('CPX', ('NPS1', 'NPS4')))
_XCD8_CDNA4 = (('SPX', ('NPS1',)), ('DPX', ('NPS1', 'NPS2')),
               ('QPX', ('NPS1', 'NPS2')), ('CPX', ('NPS1', 'NPS2')))


def _model(name: str, pf: int, vf: int | None, **kw: object) -> GpuModel:
    return GpuModel(name=name, product_name='AMD Instinct %s' % name,
                    pf_device_id=pf, vf_device_id=vf, **kw)  # type: ignore


_CDNA2 = dict(gfx='gfx90a', gfx_target_version=90010, family='CDNA2',
              pci_class=0x038000)
_CDNA3 = dict(gfx='gfx942', gfx_target_version=90402, family='CDNA3',
              pci_class=0x120000)
_CDNA4 = dict(gfx='gfx950', gfx_target_version=90500, family='CDNA4',
              pci_class=0x120000)

MODELS: tuple[GpuModel, ...] = (
    _model('MI210', 0x740f, 0x7410, compute_units=104, xcds=1,
           vram_mib=64 * GIB_MIB, vf_counts=(1,), **_CDNA2),
    _model('MI250X', 0x7408, None, compute_units=110, xcds=1,
           vram_mib=64 * GIB_MIB, **_CDNA2),
    _model('MI250X/MI250', 0x740c, None, compute_units=110, xcds=1,
           vram_mib=64 * GIB_MIB, **_CDNA2),
    _model('MI300A', 0x74a0, None, compute_units=228, xcds=6,
           vram_mib=128 * GIB_MIB, partition_modes=_XCD6_APU, **_CDNA3),
    _model('MI300X', 0x74a1, 0x74b5, compute_units=304, xcds=8,
           vram_mib=192 * GIB_MIB, partition_modes=_XCD8_CDNA3,
           vf_counts=(1, 8), **_CDNA3),
    _model('MI300X HF', 0x74a9, 0x74bd, compute_units=304, xcds=8,
           vram_mib=192 * GIB_MIB, partition_modes=_XCD8_CDNA3,
           vf_counts=(1, 8), **_CDNA3),
    _model('MI308X', 0x74a2, 0x74b6, compute_units=80, xcds=4,
           vram_mib=192 * GIB_MIB, partition_modes=_XCD4_CDNA3,
           vf_counts=(1,), **_CDNA3),
    _model('MI308X HF', 0x74a8, 0x74bc, partition_modes=_XCD4_CDNA3,
           vf_counts=(1,), **_CDNA3),
    _model('MI325X', 0x74a5, 0x74b9, compute_units=304, xcds=8,
           vram_mib=256 * GIB_MIB, partition_modes=_XCD8_CDNA3,
           vf_counts=(1,), **_CDNA3),
    _model('MI350X', 0x75a0, 0x75b0, compute_units=256, xcds=8,
           vram_mib=288 * GIB_MIB, partition_modes=_XCD8_CDNA4,
           vf_counts=(1, 2, 8), **_CDNA4),
    _model('MI355X', 0x75a3, 0x75b3, compute_units=256, xcds=8,
           vram_mib=288 * GIB_MIB, partition_modes=_XCD8_CDNA4,
           vf_counts=(1, 2, 8), **_CDNA4),
    _model('MI350P', 0x75a8, 0x75b8, partition_modes=_XCD8_CDNA4,
           vf_counts=(1,), **_CDNA4),
)

_BY_PF = {m.pf_device_id: m for m in MODELS}
_BY_VF = {m.vf_device_id: m for m in MODELS if m.vf_device_id is not None}
_BY_NAME = {m.name.lower(): m for m in MODELS}


def names() -> tuple[str, ...]:
    return tuple(m.name for m in MODELS)


def by_name(name: str) -> GpuModel:
    """The model called ``name`` (case-insensitive, ``AMD Instinct`` optional).

    :raises UnknownModel: naming the model and the known ones.
    """
    key = name.strip().lower()
    if key.startswith('amd instinct '):
        key = key[len('amd instinct '):]
    try:
        return _BY_NAME[key]
    except KeyError:
        raise exception.UnknownModel(model=name,
                                     known=', '.join(names())) from None


def by_pf_device_id(device_id: int) -> GpuModel | None:
    return _BY_PF.get(device_id)


def by_vf_device_id(device_id: int) -> GpuModel | None:
    return _BY_VF.get(device_id)


def is_vf_device_id(device_id: int) -> bool:
    return device_id in _BY_VF


def unknown_model(device_id: int, product_name: str | None = None,
                  compute_units: int | None = None,
                  vram_mib: int | None = None) -> GpuModel:
    """A model for an AMD device id the catalog does not list."""
    return GpuModel(name='unknown-%04x' % device_id,
                    product_name=product_name or 'AMD GPU %04x' % device_id,
                    pf_device_id=device_id, compute_units=compute_units,
                    vram_mib=vram_mib, known=False)


def is_gpu_class(pci_class: int) -> bool:
    return (pci_class >> 16) in GPU_CLASS_PREFIXES


def partitions_in_mode(model: GpuModel, compute_mode: str) -> int:
    """How many partitions ``compute_mode`` makes on ``model``.

    :raises InvalidPartitionMode: if the model does not offer the mode.
    """
    mode = compute_mode.upper()
    if mode not in model.compute_modes:
        raise exception.InvalidPartitionMode(
            model=model.name, what='compute mode', value=compute_mode,
            allowed=', '.join(model.compute_modes) or 'none')
    if mode == 'CPX':
        return model.xcds or 1
    return PARTITIONS_PER_MODE[mode]


def check_modes(model: GpuModel, compute_mode: str, memory_mode: str) -> None:
    """Raise unless ``compute_mode`` + ``memory_mode`` is a valid pair."""
    partitions_in_mode(model, compute_mode)
    allowed = dict(model.partition_modes)[compute_mode.upper()]
    if memory_mode.upper() not in allowed:
        raise exception.InvalidPartitionMode(
            model=model.name, what='memory mode with %s' % compute_mode,
            value=memory_mode, allowed=', '.join(allowed))


def check_vf_count(model: GpuModel, vf_count: int,
                   allow_unofficial: bool = False) -> str:
    """The compute mode ``vf_count`` VFs imply; raise if not supported."""
    if model.vf_device_id is None:
        raise exception.InvalidPartitionMode(
            model=model.name, what='VF count', value=vf_count,
            allowed='none (no SR-IOV)')
    # Name the counts this model takes, not every count GIM knows: a
    # message allowing 2 for an MI300X would only lead to the next refusal.
    allowed = [c for c in VF_COUNT_MODES
               if allow_unofficial or c in model.vf_counts]
    if vf_count not in allowed:
        raise exception.InvalidPartitionMode(
            model=model.name, what='VF count', value=vf_count,
            allowed=', '.join(str(c) for c in allowed))
    return VF_COUNT_MODES[vf_count]


#: Memory (NPS) mode GIM uses for a VF count when nothing else says so:
#: AMD's validated MI300X set is 1 VF (SPX/NPS1) or 8 VFs (CPX/NPS4);
#: MI35x: 2 VFs DPX/NPS2, 8 VFs CPX/NPS2. Other pairs fall back to the first
#: memory mode the model allows with that compute mode (inferred).
_GIM_MEMORY_DEFAULTS = {('CDNA3', 1): 'NPS1', ('CDNA3', 8): 'NPS4',
                        ('CDNA4', 1): 'NPS1', ('CDNA4', 2): 'NPS2',
                        ('CDNA4', 8): 'NPS2'}


def gim_memory_mode(model: GpuModel, vf_count: int) -> str:
    """The NPS mode a GIM GPU split into ``vf_count`` VFs runs in."""
    known = _GIM_MEMORY_DEFAULTS.get((model.family, vf_count))
    if known:
        return known
    compute = VF_COUNT_MODES.get(vf_count, 'SPX')
    allowed = dict(model.partition_modes).get(compute)
    return allowed[0] if allowed else 'NPS1'


#: VRAM the GIM host driver keeps for the PF before splitting the rest
#: among VFs (``pf_fb_size``, 256..1024 MiB; 512 is assumed).
GIM_PF_RESERVE_MIB = 512


def vf_size(model: GpuModel, vf_count: int) -> tuple[int | None, int | None]:
    """(CUs, VRAM MiB) of one VF when ``model`` is split into ``vf_count``.

    VRAM is an equal split after the PF reserve (~24 GB on MI300X x 8).
    """
    cus = model.compute_units // vf_count if model.compute_units else None
    vram = ((model.vram_mib - GIM_PF_RESERVE_MIB) // vf_count
            if model.vram_mib else None)
    return cus, vram
