"""Generic dataclass <-> plain data conversion."""

from __future__ import annotations

import dataclasses

import hypothesis
from hypothesis import strategies as st
import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import serialize
from amdgpu_virt.model import Driver
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import VirtualFunction


@dataclasses.dataclass(frozen=True)
class _Sample:
    name: str
    flag: bool = False
    pairs: tuple[tuple[str, int], ...] = ()


class TestSerialize(testtools.TestCase):

    def test_every_catalog_model_round_trips(self):
        for model in catalog.MODELS:
            self.assertEqual(model, serialize.from_data(
                GpuModel, serialize.to_data(model)))

    @hypothesis.given(st.integers(0, 0xffff), st.integers(0, 0xff),
                      st.integers(0, 0x1f), st.integers(0, 7),
                      st.integers(0, 0xffff),
                      st.sampled_from(list(Driver)),
                      st.none() | st.integers(0, 2 ** 31))
    def test_vf_round_trips(self, dom, bus, dev, fn, device_id, driver,
                            group):
        vf = VirtualFunction(PciAddress(dom, bus, dev, fn), 0, device_id,
                             driver, group)
        data = serialize.to_data(vf)
        self.assertIsInstance(data['address'], str)
        self.assertEqual(vf, serialize.from_data(VirtualFunction, data))

    def test_fixed_tuples_and_bools(self):
        sample = _Sample('x', True, (('a', 1), ('b', 2)))
        self.assertEqual(sample, serialize.from_data(
            _Sample, serialize.to_data(sample)))
        err = self.assertRaises(exception.InvalidData, serialize.from_data,
                                _Sample, {'name': 'x', 'pairs': [['a']]})
        self.assertIn('pairs[0]', str(err))
        err = self.assertRaises(exception.InvalidData, serialize.from_data,
                                _Sample, {'name': 'x', 'flag': 1})
        self.assertIn('flag', str(err))
        self.assertIn('true or false', str(err))

    def test_errors_name_the_path(self):
        err = self.assertRaises(exception.InvalidData, serialize.from_data,
                                VirtualFunction, 'nope')
        self.assertIn('(top level)', str(err))
        err = self.assertRaises(
            exception.InvalidData, serialize.from_data, VirtualFunction,
            {'address': '0000:05:02.0', 'index': 0, 'device_id': 1,
             'driver': 'nouveau'})
        self.assertIn('Field driver:', str(err))
        self.assertIn('vfio-pci', str(err))

    def test_unserializable(self):
        self.assertRaises(TypeError, serialize.to_data, object())
