"""Who uses a GPU: pods bound, chosen, ended, unreadable; claims."""

from __future__ import annotations

import testtools

from amdgpu_virt.k8s.pool import consumers
from amdgpu_virt.model import PciAddress
from amdgpu_virt.sharing import hami

A = PciAddress.parse('0000:83:00.0')
B = PciAddress.parse('0000:84:00.0')
REGISTERED = {'ga': A, 'gb': B}


def _pod(name: str, uuid: str = 'GA', node: str | None = 'n1',
         chosen: str | None = None, phase: str = 'Running',
         value: str | None = None) -> dict[str, object]:
    annotations = {hami.DEVICES_ALLOCATED: value or hami.encode_pod_devices(
        [[hami.ContainerDevice(uuid, 'AMD', 10, 3)]])}
    if chosen:
        annotations[hami.VGPU_NODE] = chosen
    spec: dict[str, object] = {'containers': []}
    if node:
        spec['nodeName'] = node
    return {'metadata': {'name': name, 'namespace': 'ns',
                         'annotations': annotations},
            'spec': spec, 'status': {'phase': phase}}


class ConsumersTest(testtools.TestCase):

    def test_table(self) -> None:
        cases = (
            # pod, consumer of A on n1 (described) or None
            (_pod('bound'), 'ns/bound'),
            (_pod('chosen', node=None, chosen='n1', phase='Pending'),
             'ns/chosen (chosen by the extender, not bound yet)'),
            (_pod('chosen-elsewhere', node=None, chosen='n2'), None),
            (_pod('not-chosen', node=None), None),
            (_pod('b', uuid='gb'), None),
            (_pod('done', phase='Succeeded'), None),
            (_pod('failed', phase='Failed'), None),
            (_pod('gone-device', uuid='gz'),
             'ns/gone-device (device gz not registered: may be this GPU)'),
            (_pod('bad', value='ga,AMD:;'), 'ns/bad (unreadable allocation'),
        )
        for pod, want in cases:
            found = consumers.on_gpu(
                [c for c in [consumers.from_pod(pod)] if c], 'n1', A,
                REGISTERED)
            name = pod['metadata']['name']  # type: ignore[index]
            if want is None:
                self.assertEqual((), found, name)
            else:
                self.assertEqual(1, len(found), name)
                self.assertTrue(found[0].describe().startswith(want),
                                found[0].describe())

    def test_claims_count_by_address(self) -> None:
        claim = consumers.Consumer('ns/claim', 'n1', consumers.State.CLAIM,
                                   addresses=frozenset({B}))
        self.assertEqual((), consumers.on_gpu([claim], 'n1', A, REGISTERED))
        (found,) = consumers.on_gpu([claim], 'n1', B, REGISTERED)
        self.assertEqual('ns/claim (allocated ResourceClaim)',
                         found.describe())
