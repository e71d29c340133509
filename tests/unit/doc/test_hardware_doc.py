"""The hardware reference page states what the catalog holds."""

from __future__ import annotations

import csv
import os

import testtools

from amdgpu_virt import catalog

DOC = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'doc',
                   'source', 'reference', 'hardware.rst')


def _table_rows() -> list[list[str]]:
    with open(DOC, encoding='utf-8') as handle:
        lines = handle.read().split('\n')
    start = next(i for i, line in enumerate(lines)
                 if line.startswith('.. csv-table:: Instinct models'))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith('   :') or not line.strip():
            if rows:
                break
            continue
        rows.append(line.strip())
    return [[cell.strip() for cell in row]
            for row in csv.reader(rows, skipinitialspace=True)]


def _expected(model) -> list[str]:
    def value(v):
        return '-' if v is None else str(v)
    modes = '; '.join('%s (%s)' % (mode, ', '.join(mems))
                      for mode, mems in model.partition_modes) or '-'
    return [model.name, '%04x' % model.pf_device_id,
            '-' if model.vf_device_id is None
            else '%04x' % model.vf_device_id,
            value(model.gfx), value(model.compute_units), value(model.xcds),
            '-' if model.vram_mib is None else str(model.vram_mib // 1024),
            '-' if model.pci_class is None else '0x%06x' % model.pci_class,
            modes, ', '.join(map(str, model.vf_counts)) or '-']


class TestHardwareDoc(testtools.TestCase):

    def test_catalog_table_matches_the_code(self):
        if not os.path.exists(DOC):
            self.skipTest('documentation sources are not installed')
        self.assertEqual([_expected(m) for m in catalog.MODELS],
                         _table_rows())
