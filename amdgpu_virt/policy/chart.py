"""A picture of a plan: one bar per GPU, coloured by owner.

Dedicated GPUs are one block; VF GPUs one box per VF; shared GPUs show
their CU ranges (per compute partition on partitioned GPUs); idle GPUs are
grey. SVG is written without any dependency; PNG needs matplotlib, which
is imported only when asked for.
"""

from __future__ import annotations

import colorsys
import dataclasses
import hashlib
from collections.abc import Sequence
from xml.sax import saxutils

from amdgpu_virt import exception
from amdgpu_virt.model import Role
from amdgpu_virt.policy.result import GpuReport

ROW = 22
BAR_X = 330
BAR_W = 600
LEFT = 10
TOP = 40
FREE = '#f4f4f4'
IDLE = '#c8c8c8'
STROKE = '#555555'


@dataclasses.dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float
    fill: str
    title: str = ''


@dataclasses.dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    size: int = 11
    bold: bool = False


def colour(owner: str, index: int | None = None) -> str:
    """A colour for ``owner``: the ``index``-th of a golden-ratio hue
    sequence (distinct neighbours), or one derived from the name."""
    digest = hashlib.sha256(owner.encode()).digest()
    if index is None:
        hue = digest[0] / 255.0
    else:
        hue = (index * 0.618033988749895) % 1.0
    sat = 0.45 + digest[1] / 255.0 * 0.3
    light = 0.55 + (index or digest[2]) % 3 * 0.07
    r, g, b = colorsys.hls_to_rgb(hue, light, sat)
    return '#%02x%02x%02x' % (int(r * 255), int(g * 255), int(b * 255))


def _palette(gpus: Sequence[GpuReport]) -> dict[str, str]:
    owners: list[str] = []
    for gpu in gpus:
        for owner in gpu.used_by:
            if owner not in owners:
                owners.append(owner)
    return {owner: colour(owner, i) for i, owner in enumerate(owners)}


def layout(gpus: Sequence[GpuReport], title: str = 'GPU plan'
           ) -> tuple[list[Box], list[Label], float, float]:
    """Boxes and labels of the chart, and its width and height."""
    boxes: list[Box] = []
    labels: list[Label] = [Label(LEFT, 24, title, 15, True)]
    owners: list[str] = []
    palette = _palette(gpus)

    def fill(owner: str | None) -> str:
        return palette.get(owner, colour(owner)) if owner else FREE

    def name_in(x: float, width: float, y: float, owner: str) -> None:
        if width >= 8 * min(len(owner), 4) + 8:
            room = int((width - 8) // 6.5)
            text = owner if len(owner) <= room else owner[:max(1, room - 1)] \
                + '~'
            labels.append(Label(x + 4, y + 12, text, 9))
    y = float(TOP)
    for gpu in gpus:
        labels.append(Label(LEFT, y + 15, '%s %s %s %s' % (
            gpu.host, gpu.address, gpu.model, gpu.role.value)))
        h = ROW - 6
        if gpu.role is Role.IDLE:
            boxes.append(Box(BAR_X, y, BAR_W, h, IDLE, 'idle'))
        elif gpu.role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED):
            owner = gpu.used_by[0] if gpu.used_by else None
            boxes.append(Box(BAR_X, y, BAR_W, h, fill(owner),
                             '%s: %s' % (gpu.role.value, owner or 'free')))
            if owner:
                name_in(BAR_X, BAR_W, y, owner)
        elif gpu.role is Role.NOVA_VF:
            count = len(gpu.vf_owners) or 1
            width = BAR_W / count
            for i, owner in enumerate(gpu.vf_owners):
                boxes.append(Box(BAR_X + i * width, y, width, h, fill(owner),
                                 'VF %d: %s' % (i, owner or 'free')))
                if owner:
                    name_in(BAR_X + i * width, width, y, owner)
        else:
            total = sum(size for _p, size in gpu.partitions) or 1
            offsets: dict[int | None, tuple[float, float]] = {}
            x = float(BAR_X)
            for part, size in gpu.partitions:
                width = BAR_W * size / total
                offsets[part] = (x, width / size)
                boxes.append(Box(x, y, width, h, FREE,
                                 'partition %s: free' % part
                                 if part is not None else 'free CUs'))
                x += width
            for owner, part, start, length in gpu.cu_owners:
                base, per_cu = offsets[part]
                name_in(base + start * per_cu, length * per_cu, y, owner)
                boxes.append(Box(base + start * per_cu, y, length * per_cu,
                                 h, fill(owner), '%s: CUs %d-%d%s' % (
                                     owner, start, start + length - 1,
                                     '' if part is None
                                     else ' of partition %d' % part)))
        for owner in gpu.used_by:
            if owner not in owners:
                owners.append(owner)
        y += ROW
    y += 10
    labels.append(Label(LEFT, y + 12, 'Owners', 12, True))
    y += 20
    for i, owner in enumerate(owners):
        col, row = i % 4, i // 4
        bx = LEFT + col * 230
        by = y + row * 18
        boxes.append(Box(bx, by, 12, 12, fill(owner), owner))
        labels.append(Label(bx + 18, by + 11, owner))
    height = y + (len(owners) + 3) // 4 * 18 + 20
    return boxes, labels, BAR_X + BAR_W + 20.0, height


def svg(gpus: Sequence[GpuReport], title: str = 'GPU plan') -> str:
    """The chart as an SVG document."""
    boxes, labels, width, height = layout(gpus, title)
    esc = saxutils.escape
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif">' % (
               width, height, width, height),
           '<rect x="0" y="0" width="%d" height="%d" fill="white"/>' % (
               width, height)]
    for box in boxes:
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" '
                   'fill="%s" stroke="%s" stroke-width="0.5"><title>%s'
                   '</title></rect>' % (box.x, box.y, box.w, box.h, box.fill,
                                        STROKE, esc(box.title)))
    for label in labels:
        out.append('<text x="%.1f" y="%.1f" font-size="%d"%s>%s</text>' % (
            label.x, label.y, label.size,
            ' font-weight="bold"' if label.bold else '', esc(label.text)))
    out.append('</svg>')
    return '\n'.join(out) + '\n'


def png(gpus: Sequence[GpuReport], path: str,
        title: str = 'GPU plan') -> None:
    """Write the chart as PNG with matplotlib.

    :raises AmdgpuVirtError: matplotlib is not installed (naming it and
        the SVG alternative).
    """
    try:
        import matplotlib
        matplotlib.use('Agg')
        from matplotlib import patches
        from matplotlib import pyplot
    except ImportError:
        raise exception.AmdgpuVirtError(
            'cannot write %s: PNG charts need matplotlib, which is not '
            "installed; pip install 'amdgpu_virt[chart]', or write an .svg "
            'chart instead'
            % path) from None
    boxes, labels, width, height = layout(gpus, title)
    dpi = 100
    fig = pyplot.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis('off')
    for box in boxes:
        ax.add_patch(patches.Rectangle((box.x, box.y), box.w, box.h,
                                       facecolor=box.fill, edgecolor=STROKE,
                                       linewidth=0.5))
    for label in labels:
        ax.text(label.x, label.y, label.text, fontsize=label.size * 0.75,
                fontweight='bold' if label.bold else 'normal')
    fig.savefig(path, dpi=dpi)
    pyplot.close(fig)
