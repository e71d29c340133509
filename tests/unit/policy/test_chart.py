"""The plan chart: SVG without dependencies, PNG only with matplotlib."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from unittest import mock

import testtools

from amdgpu_virt import exception
from amdgpu_virt.policy import chart
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from tests.unit.policy import utils

NS = {'s': 'http://www.w3.org/2000/svg'}


class TestChart(testtools.TestCase):

    def setUp(self):
        super().setUp()
        hosts = [utils.host('gim', 'gim-cpx', gpus=2),
                 utils.host('cpx', 'cpx', nps='nps4', gpus=1)]
        self.plan = utils.plan(hosts, [
            Workload('vm-1', Platform.VM, memory_mib=8192, cus=19),
            Workload('whole', Platform.VM),
            Workload('pod-co', Platform.POD, Tenancy.TRUSTED, cus=20,
                     memory_mib=8192)])

    def test_svg_is_well_formed(self):
        root = ET.fromstring(chart.svg(self.plan.gpus).encode())
        titles = [t.text for t in root.iterfind('.//s:rect/s:title', NS)]
        # 8 VF boxes, 1 dedicated, 8 partitions + 1 slice, legend of 3
        self.assertEqual(8 + 1 + 8 + 1 + 3, len(titles))
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
