"""PciAddress and the model value objects."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import Driver
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import InventoryWarning
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role


class TestPciAddress(testtools.TestCase):

    @hypothesis.given(st.integers(0, 0xffff), st.integers(0, 0xff),
                      st.integers(0, 0x1f), st.integers(0, 7))
    def test_str_parse_round_trip(self, domain, bus, device, function):
        address = PciAddress(domain, bus, device, function)
        text = str(address)
        self.assertRegex(text,
                         r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$')
        self.assertEqual(address, PciAddress.parse(text))
        self.assertEqual(address, PciAddress.parse(text.upper()))

    def test_domain_is_optional(self):
        self.assertEqual(PciAddress(0, 0x85, 0, 0),
                         PciAddress.parse('85:00.0'))
        self.assertEqual('0000:85:02.7', str(PciAddress.parse(' 85:02.7\n')))

    def test_bad_addresses_name_the_value(self):
        for bad in ('', 'abc', '0000:85:00', '0000:85:00.8', '0000:85:20.0',
                    '10000:85:00.0', '0000:855:00.0', '0000-85-00.0', None,
                    85):
            err = self.assertRaises(exception.InvalidPciAddress,
                                    PciAddress.parse, bad)
            self.assertIn(repr(bad), str(err))

    def test_out_of_range_fields(self):
        for fields in ((0x10000, 0, 0, 0), (0, 0x100, 0, 0), (0, 0, 0x20, 0),
                       (0, 0, 0, 8), (-1, 0, 0, 0)):
            self.assertRaises(exception.InvalidPciAddress, PciAddress,
                              *fields)

    @hypothesis.given(st.text(max_size=20))
    def test_parse_never_raises_anything_else(self, text):
        try:
            address = PciAddress.parse(text)
        except exception.InvalidPciAddress as err:
            self.assertIn(repr(text), str(err))
        else:
            self.assertEqual(address, PciAddress.parse(str(address)))

    def test_order_follows_the_bus(self):
        addresses = [PciAddress.parse(a) for a in
                     ('0000:e5:00.0', '0000:05:00.0', '0001:00:00.0',
                      '0000:05:02.1')]
        self.assertEqual(['0000:05:00.0', '0000:05:02.1', '0000:e5:00.0',
                          '0001:00:00.0'], [str(a) for a in sorted(addresses)])


class TestEnumsAndInventory(testtools.TestCase):

    def test_driver_from_name(self):
        self.assertIs(Driver.AMDGPU, Driver.from_name('amdgpu'))
        self.assertIs(Driver.VFIO_PCI, Driver.from_name('vfio-pci'))
        self.assertIs(Driver.NONE, Driver.from_name(None))
        self.assertIs(Driver.NONE, Driver.from_name(''))
        self.assertIs(Driver.OTHER, Driver.from_name('nouveau'))

    def test_role_side(self):
        self.assertEqual('nova', Role.NOVA_VF.side)
        self.assertEqual('k8s', Role.K8S_SHARED.side)
        self.assertIsNone(Role.IDLE.side)

    def test_host_inventory_lookup_and_counts(self):
        host = simulate.design_host(simulate.HostSpec(
            'h', gpus=2, gpu_modes=('gim-cpx', 'qpx')))
        self.assertEqual(8, host.vf_count)
        self.assertEqual(4, host.partition_count)
        self.assertEqual('0000:25:00.0', host.gpu('25:00.0').id)
        err = self.assertRaises(exception.InventoryError, host.gpu,
                                '0000:99:00.0')
        self.assertIn('no GPU at 0000:99:00.0', str(err))
        self.assertIn('h', str(err))

    def test_warning_text(self):
        self.assertEqual('/sys/x: odd', str(InventoryWarning('/sys/x',
                                                             'odd')))

    def test_frozen(self):
        host = HostInventory(hostname='h')
        self.assertRaises(AttributeError, setattr, host, 'hostname', 'x')
