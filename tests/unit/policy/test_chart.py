"""The plan chart: SVG without dependencies, PNG only with matplotlib."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from unittest import mock

import testtools

from amdgpu_virt import exception
from amdgpu_virt.model import Role
from amdgpu_virt.policy import chart
from amdgpu_virt.policy.result import GpuReport
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from tests.unit.policy import utils

NS = {'s': 'http://www.w3.org/2000/svg'}


def _small_plan():
    hosts = [utils.host('gim', 'gim-cpx', gpus=2),
             utils.host('cpx', 'cpx', nps='nps4', gpus=1)]
    return utils.plan(hosts, [
        Workload('vm-1', Platform.VM, memory_mib=8192, cus=19),
        Workload('whole', Platform.VM),
        Workload('pod-co', Platform.POD, Tenancy.TRUSTED, cus=20,
                 memory_mib=8192)])


class TestChart(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.plan = _small_plan()

    def test_svg_is_well_formed(self):
        root = ET.fromstring(chart.svg(self.plan.gpus).encode())
        titles = [t.text for t in root.iterfind('.//s:rect/s:title', NS)]
        owners = [t for t in titles if not t.startswith('VRAM')
                  and '%' not in t and not t.startswith('share')]
        # 8 VF boxes, 1 dedicated, 8 partitions + 1 slice, legend of 3
        self.assertEqual(8 + 1 + 8 + 1 + 3, len(owners))
        self.assertIn('VF 0: vm-1', titles)
        self.assertIn('VF 1: free', titles)
        self.assertIn('nova-dedicated: whole', titles)
        self.assertIn('pod-co: CUs 0-19 of partition 0', titles)
        texts = [t.text for t in root.iterfind('.//s:text', NS)]
        self.assertIn('cpx 0000:05:00.0 MI300X k8s-shared', texts)

    def test_colours_are_stable(self):
        self.assertEqual(chart.colour('a'), chart.colour('a'))
        self.assertNotEqual(chart.colour('a'), chart.colour('b'))
        self.assertRegex(chart.colour('x'), '^#[0-9a-f]{6}$')

    def test_png_without_matplotlib(self):
        # matplotlib is installed here; hide it to see the error users
        # without it get
        with mock.patch.dict(sys.modules, {'matplotlib': None}):
            err = self.assertRaises(exception.AmdgpuVirtError, chart.png,
                                    self.plan.gpus, 'out.png')
        self.assertIn('out.png', str(err))
        self.assertIn('matplotlib', str(err))
        self.assertIn('.svg', str(err))


def _fleet(hosts: int) -> list[GpuReport]:
    """A large plan's GPUs, made directly (no planning needed)."""
    roles = (Role.NOVA_VF, Role.NOVA_DEDICATED, Role.K8S_SHARED,
             Role.K8S_DEDICATED, Role.IDLE)
    gpus = []
    for h in range(hosts):
        for i in range(8):
            role = roles[(h + i) % len(roles)]
            gpus.append(GpuReport(
                host='very-long-host-name-of-rack-%04d' % h,
                address='0000:%02x:00.0' % (5 + 32 * i), model='MI300X',
                role=role, mode='-', used_by=('w-%d-%d' % (h, i),)
                if role is not Role.IDLE else (), cus=304,
                vram_mib=196608, demand=0.5, granted=0.5,
                vf_owners=('w-%d-%d' % (h, i),) + (None,) * 7
                if role is Role.NOVA_VF else ()))
    return gpus


class TestChartScaleAndSize(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.plan = _small_plan()

    def test_detailed_has_scale_and_vram(self):
        text = chart.svg(self.plan.gpus, decisions=self.plan.decisions)
        root = ET.fromstring(text.encode())
        texts = [t.text for t in root.iterfind('.//s:text', NS)]
        for tick in ('0%', '25%', '50%', '75%', '100%'):
            self.assertIn(tick, texts)
        self.assertIn('share of the GPU (CUs)', texts)
        # the whole GPU is held; one of 8 VFs holds an eighth; the CU
        # slice its grant
        self.assertIn('VRAM 192 of 192 GiB', texts)
        self.assertIn('VRAM 24 of 192 GiB', texts)
        self.assertIn('VRAM 8 of 192 GiB', texts)
        self.assertEqual([], chart.overlapping_labels(chart.layout(
            self.plan.gpus, decisions=self.plan.decisions)[1]))

    def test_2000_hosts_stay_usable(self):
        gpus = _fleet(2000)
        boxes, labels, width, height = chart.layout(gpus)
        # about square and bounded (one GPU per row was 352,126 px tall)
        self.assertLess(height, 6000)
        self.assertLess(width, 6000)
        self.assertLess(max(width, height) / min(width, height), 2.5)
        self.assertEqual([], chart.overlapping_labels(labels))
        # every host is named (cut to fit), every GPU has a cell
        host_labels = [lb.text for lb in labels
                       if lb.text.startswith('very-long')]
        self.assertEqual(2000, len(host_labels))
        # cut in the middle: the host number stays readable
        self.assertEqual(2000, len(set(host_labels)))
        self.assertIn('1999', host_labels[-1])
        self.assertTrue(all(lb.size >= 9 for lb in labels))
        self.assertTrue(all(b.x + b.w <= width and b.y + b.h <= height
                            for b in boxes))
        cells = [b for b in boxes if 'VRAM' in b.title and b.h == chart.CELL_H
                 and b.w == chart.CELL_W]
        self.assertEqual(16000, len(cells))
        text = chart.svg(gpus)
        root = ET.fromstring(text.encode())
        self.assertEqual(int(float(root.get('height'))), int(height))
        self.assertLess(len(text), 40 * 1024 * 1024)

    def test_compact_cells_say_who_and_how_much(self):
        boxes, labels, width, height = chart.layout(_fleet(10))
        self.assertTrue(all(b.x + b.w <= width and b.y + b.h <= height
                            for b in boxes))
        self.assertTrue(all(lb.bounds()[2] <= width for lb in labels))
        tips = {b.title for b in boxes}
        self.assertTrue(any(re.search(r'nova-vf .*: w-0-0; VRAM 24 of 192 '
                                      r'GiB', t) for t in tips))
        texts = [lb.text for lb in labels]
        self.assertIn('nova-vf', texts)          # role legend
        self.assertIn('100%', texts)             # scale
        self.assertEqual([], chart.overlapping_labels(labels))

    def test_overlap_check_finds_overlaps(self):
        a = chart.Label(0, 10, 'x' * 20)
        self.assertEqual([(a, a)], chart.overlapping_labels([a, a]))
        b = chart.Label(0, 40, 'x' * 20)
        self.assertEqual([], chart.overlapping_labels([a, b]))

    def test_fit_cuts_to_the_room(self):
        self.assertEqual('abc', chart.fit('abc', 100, 10))
        self.assertEqual('rack-~0042', chart.fit('rack-12-compute-0042', 63,
                                                 10, middle=True))
        cut = chart.fit('a' * 50, 63, 10)
        self.assertEqual(10, len(cut))
        self.assertTrue(cut.endswith('~'))
