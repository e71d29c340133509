"""A picture of a plan: every GPU, who uses it, and its VRAM.

Two layouts, chosen by the fleet's size:

* **detailed** (up to :data:`DETAIL_LIMIT` GPUs): one row per GPU, coloured
  by owner. Dedicated GPUs are one block; VF GPUs one box per VF; shared
  GPUs show their CU ranges (per compute partition on partitioned GPUs);
  idle GPUs are grey. A scale above the bars gives the share of the GPU's
  CUs; a strip under each bar and the figure to its right give the VRAM
  held. Owner names are written in the boxes wide enough for them, and
  listed in a legend.
* **compact** (larger fleets, e.g. 2,000 hosts): one row per host, one
  cell per GPU coloured by role, filled by the share in use (VFs, CUs or
  the whole GPU), with a VRAM strip under it; hosts are laid out in
  columns so that the picture stays about as wide as it is tall. Owners
  are in each cell's tooltip.

Labels are cut to the room they have, so none overlaps another (see
:func:`overlapping_labels`). SVG is written without any dependency; PNG
needs matplotlib, which is imported only when asked for.
"""

from __future__ import annotations

import colorsys
import dataclasses
import hashlib
import math
from collections.abc import Iterable, Sequence
from xml.sax import saxutils

from amdgpu_virt import exception
from amdgpu_virt.model import Role
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.result import GpuReport

#: Above this many GPUs the compact layout is used.
DETAIL_LIMIT = 64
#: Legend entries listed by name at most (detailed layout).
LEGEND_LIMIT = 200
#: Width of a character as a share of the font size (sans-serif, about).
CHAR_W = 0.62

ROW = 30
BAR_H = 16
VRAM_H = 4
BAR_X = 330
BAR_W = 600
LEFT = 10
TOP = 62
FREE = '#f4f4f4'
IDLE = '#c8c8c8'
STROKE = '#555555'
VRAM = '#4a4a4a'

# compact layout
HOST_ROW = 16
CELL_W = 40
CELL_GAP = 3
CELL_H = 9
HOST_LABEL_W = 130
COLUMN_GAP = 24
ROLE_COLOURS = {
    Role.NOVA_VF: ('#3b7dd8', '#d5e3f7'),
    Role.NOVA_DEDICATED: ('#1f4e96', '#c9d5ea'),
    Role.K8S_SHARED: ('#2e9e5b', '#d2eedd'),
    Role.K8S_DEDICATED: ('#1b6b3a', '#c8ddd0'),
    Role.IDLE: (IDLE, IDLE),
}


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
    """Text whose baseline starts at (x, y)."""

    x: float
    y: float
    text: str
    size: int = 11
    bold: bool = False

    @property
    def width(self) -> float:
        return len(self.text) * self.size * CHAR_W

    def bounds(self) -> tuple[float, float, float, float]:
        """Approximate box: left, top, right, bottom."""
        return (self.x, self.y - self.size, self.x + self.width,
                self.y + self.size * 0.25)


def fit(text: str, width: float, size: int, middle: bool = False) -> str:
    """``text`` cut to fit ``width`` at ``size``, a ``~`` where it was cut:
    at the end, or (``middle``) between its head and its tail, which keeps
    the distinguishing end of names like ``rack-12-compute-0042``."""
    room = int(width // (size * CHAR_W))
    if len(text) <= room:
        return text
    if room <= 0:
        return ''
    if middle and room >= 5:
        tail = (room - 1) // 2
        return text[:room - 1 - tail] + '~' + text[len(text) - tail:]
    return text[:room - 1] + '~'


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


def vram_held(gpus: Sequence[GpuReport], decisions: Iterable[Decision]
              ) -> dict[tuple[str, str], int]:
    """MiB of VRAM held on each (host, address).

    A dedicated GPU in use holds all of it, a VF its share (VRAM / VFs),
    a shared GPU what its slices were granted.
    """
    known = {(g.host, g.address): g for g in gpus}
    held: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        if gpu.role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED) \
                and gpu.used_by:
            held[(gpu.host, gpu.address)] = gpu.vram_mib
        elif gpu.role is Role.NOVA_VF and gpu.vf_owners:
            used = sum(1 for owner in gpu.vf_owners if owner)
            held[(gpu.host, gpu.address)] = (
                gpu.vram_mib * used // len(gpu.vf_owners))
    for decision in decisions:
        if not decision.placed:
            continue
        for grant in decision.grants:
            key = (decision.host or '', grant.address)
            shared = known.get(key)
            if shared is None or shared.role is not Role.K8S_SHARED:
                continue
            held[key] = min(shared.vram_mib,
                            held.get(key, 0) + grant.memory_mib)
    return held


def _gib(mib: int) -> str:
    return '%g' % round(mib / 1024, 1)


def _owners(gpus: Sequence[GpuReport]) -> list[str]:
    owners: list[str] = []
    seen: set[str] = set()
    for gpu in gpus:
        for owner in gpu.used_by:
            if owner not in seen:
                seen.add(owner)
                owners.append(owner)
    return owners


def _scale(boxes: list[Box], labels: list[Label], x: float, y: float,
           width: float, text: str) -> None:
    """A 0-100 % axis of ``width`` at ``y`` (ticks and labels)."""
    boxes.append(Box(x, y, width, 1, STROKE, text))
    for pct in (0, 25, 50, 75, 100):
        tx = x + width * pct / 100
        boxes.append(Box(tx - 0.5, y - 4, 1, 5, STROKE, '%d%%' % pct))
        tick = '%d%%' % pct
        size = 9
        lx = tx - len(tick) * size * CHAR_W / 2
        if pct == 100:
            lx = tx - len(tick) * size * CHAR_W
        labels.append(Label(max(x, lx), y - 6, tick, size))
    labels.append(Label(x + width + 8, y + 3, text, 9))


def _detailed(gpus: Sequence[GpuReport], held: dict[tuple[str, str], int],
              title: str) -> tuple[list[Box], list[Label], float, float]:
    boxes: list[Box] = []
    labels: list[Label] = [Label(LEFT, 24, title, 15, True)]
    owners = _owners(gpus)
    palette = {owner: colour(owner, i) for i, owner in enumerate(owners)}

    def fill(owner: str | None) -> str:
        return palette.get(owner, colour(owner)) if owner else FREE

    def name_in(x: float, width: float, y: float, owner: str) -> None:
        text = fit(owner, width - 8, 9)
        if len(text) >= min(len(owner), 4):
            labels.append(Label(x + 4, y + 12, text, 9))

    _scale(boxes, labels, BAR_X, TOP - 12, BAR_W,
           'share of the GPU (CUs)')
    y = float(TOP)
    right = BAR_X + BAR_W + 8
    for gpu in gpus:
        labels.append(Label(LEFT, y + 13, fit('%s %s %s %s' % (
            gpu.host, gpu.address, gpu.model, gpu.role.value),
            BAR_X - LEFT - 8, 11)))
        h = BAR_H
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
        used = held.get((gpu.host, gpu.address), 0)
        vram = gpu.vram_mib or 1
        vram_text = 'VRAM %s of %s GiB' % (_gib(used), _gib(gpu.vram_mib))
        boxes.append(Box(BAR_X, y + h + 2, BAR_W, VRAM_H, FREE, vram_text))
        if used:
            boxes.append(Box(BAR_X, y + h + 2, BAR_W * used / vram, VRAM_H,
                             VRAM, vram_text))
        labels.append(Label(right, y + 13, vram_text, 9))
        y += ROW
    width = right + 130.0
    y += 10
    labels.append(Label(LEFT, y + 12, 'Owners', 12, True))
    y += 20
    if len(owners) > LEGEND_LIMIT:
        labels.append(Label(LEFT, y + 11, '%d owners: see each box\'s '
                            'tooltip' % len(owners)))
        return boxes, labels, width, y + 30
    per_row = max(1, int((width - LEFT) // 230))
    for i, owner in enumerate(owners):
        col, row = i % per_row, i // per_row
        bx = LEFT + col * 230
        by = y + row * 18
        boxes.append(Box(bx, by, 12, 12, fill(owner), owner))
        labels.append(Label(bx + 18, by + 11, fit(owner, 205, 11)))
    height = y + math.ceil(len(owners) / per_row) * 18 + 20
    return boxes, labels, width, height


def _columns(hosts: int, column_w: float) -> int:
    """Columns that make the compact picture about square."""
    area = hosts * HOST_ROW * column_w
    return max(1, min(hosts, round(math.sqrt(area) / column_w)))


def _compact(gpus: Sequence[GpuReport], held: dict[tuple[str, str], int],
             title: str) -> tuple[list[Box], list[Label], float, float]:
    hosts: dict[str, list[GpuReport]] = {}
    for gpu in gpus:
        hosts.setdefault(gpu.host, []).append(gpu)
    widest = max(len(v) for v in hosts.values())
    column_w = HOST_LABEL_W + widest * (CELL_W + CELL_GAP) + COLUMN_GAP
    columns = _columns(len(hosts), column_w)
    per_column = math.ceil(len(hosts) / columns)
    boxes: list[Box] = []
    labels: list[Label] = [Label(LEFT, 24, fit(
        '%s: %d hosts, %d GPUs' % (title, len(hosts), len(gpus)),
        columns * column_w, 15), 15, True)]
    # legend and scale
    x = float(LEFT)
    for role, (dark, _light) in ROLE_COLOURS.items():
        boxes.append(Box(x, 36, 12, 12, dark, role.value))
        labels.append(Label(x + 16, 46, role.value, 10))
        x += 16 + len(role.value) * 10 * CHAR_W + 14
    legend_right = x
    scale_text = 'cell = 1 GPU; filled: share in use; strip: VRAM held'
    _scale(boxes, labels, LEFT, 70, CELL_W * 5, scale_text)
    legend_right = max(legend_right, LEFT + CELL_W * 5 + 8
                       + len(scale_text) * 9 * CHAR_W)
    top = 84.0
    for n, (host, host_gpus) in enumerate(hosts.items()):
        col, row = n // per_column, n % per_column
        x0 = LEFT + col * column_w
        y = top + row * HOST_ROW
        labels.append(Label(x0, y + 10, fit(host, HOST_LABEL_W - 6, 10,
                                            middle=True), 10))
        for i, gpu in enumerate(host_gpus):
            cx = x0 + HOST_LABEL_W + i * (CELL_W + CELL_GAP)
            dark, light = ROLE_COLOURS.get(gpu.role, (IDLE, IDLE))
            used = held.get((gpu.host, gpu.address), 0)
            tip = '%s %s %s %s %s: %s; VRAM %s of %s GiB' % (
                gpu.host, gpu.address, gpu.model, gpu.role.value, gpu.mode,
                ', '.join(gpu.used_by) or 'free', _gib(used),
                _gib(gpu.vram_mib))
            boxes.append(Box(cx, y, CELL_W, CELL_H, light, tip))
            if gpu.granted > 0:
                boxes.append(Box(cx, y, CELL_W * gpu.granted, CELL_H, dark,
                                 tip))
            if used:
                boxes.append(Box(cx, y + CELL_H + 1,
                                 CELL_W * used / (gpu.vram_mib or 1), 3,
                                 VRAM, tip))
    height = top + per_column * HOST_ROW + 20
    return boxes, labels, max(columns * column_w + LEFT,
                              legend_right + LEFT), height


def layout(gpus: Sequence[GpuReport], title: str = 'GPU plan',
           decisions: Iterable[Decision] = ()
           ) -> tuple[list[Box], list[Label], float, float]:
    """Boxes and labels of the chart, and its width and height."""
    held = vram_held(gpus, decisions)
    if len(gpus) > DETAIL_LIMIT:
        return _compact(gpus, held, title)
    return _detailed(gpus, held, title)


def overlapping_labels(labels: Sequence[Label]
                       ) -> list[tuple[Label, Label]]:
    """Pairs of labels whose approximate boxes intersect."""
    ordered = sorted(labels, key=lambda lb: lb.bounds()[1])
    found = []
    for i, a in enumerate(ordered):
        al, at, ar, ab = a.bounds()
        for b in ordered[i + 1:]:
            bl, bt, br, bb = b.bounds()
            if bt >= ab:
                break
            if bl < ar and al < br:
                found.append((a, b))
    return found


def svg(gpus: Sequence[GpuReport], title: str = 'GPU plan',
        decisions: Iterable[Decision] = ()) -> str:
    """The chart as an SVG document."""
    boxes, labels, width, height = layout(gpus, title, decisions)
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
        title: str = 'GPU plan', decisions: Iterable[Decision] = ()) -> None:
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
    boxes, labels, width, height = layout(gpus, title, decisions)
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
