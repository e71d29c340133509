"""stevedore loading must fail loudly, naming what was asked and known."""

import testtools

from amdgpu_virt import exception
from amdgpu_virt import plugins
from amdgpu_virt.sharing import allocator

NS = 'amdgpu_virt.sharing.strategies'


class TestPlugins(testtools.TestCase):

    def test_available_lists_registered_names(self):
        self.assertIn('first-fit', plugins.available(NS))
        self.assertEqual([], plugins.available('amdgpu_virt.no-such-ns'))

    def test_load_driver(self):
        strategy = plugins.load_driver(NS, 'first-fit')
        self.assertIsInstance(strategy, allocator.FirstFitStrategy)
        self.assertIs(allocator.FirstFitStrategy,
                      plugins.load_driver(NS, 'first-fit', invoke=False))

    def test_misspelt_name_names_namespace_and_known(self):
        err = self.assertRaises(exception.DriverNotFound,
                                plugins.load_driver, NS, 'frist-fit')
        self.assertIn("No %s plugin named 'frist-fit'" % NS, str(err))
        self.assertIn('first-fit', str(err))

    def test_plugin_that_fails_to_load_raises(self):
        # The sysfs driver needs a conf argument: calling it without one
        # must surface as DriverNotFound, not be skipped.
        err = self.assertRaises(exception.DriverNotFound,
                                plugins.load_driver, 'amdgpu_virt.inventory',
                                'snapshot')
        self.assertIn('snapshot', str(err))

    def test_load_ordered_keeps_order_and_rejects_unknown(self):
        loaded = plugins.load_ordered(NS, ['first-fit'])
        self.assertEqual(['first-fit'], [p.name for p in loaded])
        err = self.assertRaises(exception.DriverNotFound,
                                plugins.load_ordered, NS,
                                ['first-fit', 'nope'])
        self.assertIn("'nope'", str(err))
