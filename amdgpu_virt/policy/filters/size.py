"""Sizes: what fits in a GPU, a VF, and a sensible CU slice."""

from __future__ import annotations

from amdgpu_virt import catalog
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Workload


class SizeFilter(base.PolicyFilter):
    """Requests larger than the unit of the kind cannot use that kind.

    * larger than the whole GPU (CUs or memory): no kind on that model;
    * larger than one VF of the model: not a VF (a model without SR-IOV
      has no VF at all);
    * above ``[policy] dedicated_threshold`` of the GPU: not a CU slice.
    """

    name = 'size'

    def check(self, workload: Workload, option: base.Option) -> Verdict:
        model = option.model
        cus = workload.cus_on(model)
        mib = workload.memory_on(model)
        total_cus = model.compute_units or 0
        vram = model.vram_mib or 0
        if cus > total_cus or mib > vram:
            return self._verdict(
                option, False, 'requested %d CUs and %d MiB per GPU, but a '
                'whole %s has %d CUs and %d MiB' % (
                    cus, mib, model.name, total_cus, vram), per_model=True)
        if option.kind is Kind.DEDICATED:
            return self._verdict(
                option, True, 'requested %d of %d CUs and %d of %d MiB per '
                'GPU (%.0f%% of a %s)' % (
                    cus, total_cus, mib, vram,
                    100 * workload.fraction_on(model), model.name),
                per_model=True)
        if option.kind is Kind.VF:
            if option.vf_count is None:
                why = ('the model has no SR-IOV'
                       if model.vf_device_id is None or not model.vf_counts
                       else 'none of its GPUs here can run the GIM driver')
                return self._verdict(option, False, '%s offers no VFs (%s)'
                                     % (model.name, why), per_model=True)
            vf_cus, vf_mib = catalog.vf_size(model, option.vf_count)
            vf_cus = vf_cus or 0
            vf_mib = vf_mib or 0
            if cus > vf_cus or mib > vf_mib:
                return self._verdict(
                    option, False, 'requested %d CUs and %d MiB per GPU, but '
                    'one of %d VFs of a %s has %d CUs and %d MiB' % (
                        cus, mib, option.vf_count, model.name, vf_cus,
                        vf_mib), per_model=True)
            return self._verdict(
                option, True, 'requested %d CUs and %d MiB fit one of %d VFs '
                'of a %s (%d CUs, %d MiB)' % (
                    cus, mib, option.vf_count, model.name, vf_cus, vf_mib),
                per_model=True)
        threshold = self.conf.policy.dedicated_threshold
        fraction = workload.fraction_on(model)
        if workload.whole or fraction > threshold:
            return self._verdict(
                option, False, 'requested %.0f%% of a %s (%d CUs, %d MiB), '
                'above the %.0f%% up to which GPUs are shared '
                '([policy] dedicated_threshold)' % (
                    100 * fraction, model.name, cus, mib, 100 * threshold),
                per_model=True)
        return self._verdict(
            option, True, 'requested %.0f%% of a %s (%d CUs, %d MiB), within '
            'the %.0f%% up to which GPUs are shared' % (
                100 * fraction, model.name, cus, mib, 100 * threshold),
            per_model=True)
