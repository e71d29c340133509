"""Reading a ResourceClaim's allocation: the results of this driver.

kubelet sends only the claim's namespace, name and UID; the driver reads
the claim itself and uses the results whose ``driver`` is its own. The
claim status is written by the kube-scheduler, yet everything here is
checked as input: the UID must be the one kubelet named, every result of
this driver must name this node's pool and a device the node publishes,
a share's ``consumedCapacity`` must fit the device (its quantities are
bounded on their text before any arithmetic), and no device or share may
come twice. An ``adminAccess`` result (a monitoring claim) is read as
what it is: it watches its device and owns nothing of it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import quantity as api_quantity
from amdgpu_virt.k8s.dra import devices as dra_devices

MIB = 1 << 20
#: a Kubernetes quantity: a decimal number, then an exponent or a suffix
#: most digits of a quantity's whole value: more than any device holds,
#: so a larger value is refused before anything is computed from it
MAX_DIGITS = 24
#: a request name (and a subrequest's), a DNS label as the API requires
_REQUEST = re.compile(r'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?'
                      r'(/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$')
#: what kubelet may send as a claim UID (it names files)
_UID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9-]{0,63}$')
#: a share's ID: the API server makes it a UUID; it names a CDI device
_SHARE_ID = re.compile(r'^[0-9A-Fa-f][0-9A-Fa-f-]{0,63}$')
#: results of one claim read at most (the API server stores at most 32,
#: AllocationResultsMaxSize; this only bounds what a forged claim costs)
MAX_RESULTS = 4096


@dataclasses.dataclass(frozen=True)
class Result:
    """One result of this driver, checked against the node's devices."""

    request: str
    pool: str
    device: dra_devices.DraDevice
    share_id: str = ''
    compute_units: int = 0
    memory_mib: int = 0
    #: an ``adminAccess`` result: the device is watched (monitoring), not
    #: owned; it takes nothing from its owner
    admin: bool = False

    @property
    def top_request(self) -> str:
        """The claim's request name (``req`` of ``req/sub``)."""
        return self.request.split('/', 1)[0]


def check_uid(uid: str) -> None:
    """A claim UID usable in file names.

    :raises DraClaimError: naming the UID.
    """
    if not isinstance(uid, str) or not _UID.match(uid):
        raise _fail(repr(uid), 'the claim UID must be letters, digits and '
                    '"-" (at most 64), as Kubernetes makes them')


def _fail(key: str, reason: str) -> exception.DraClaimError:
    return exception.DraClaimError(claim=key, reason=reason)


def quantity(key: str, where: str, value: Any) -> Fraction:
    """The exact value of a quantity as the API writes it (``24Gi``,
    ``38``, ``1.5e3``), read by :mod:`amdgpu_virt.k8s.api.quantity`,
    whose bounds on the text come before any arithmetic.

    :raises DraClaimError: naming the claim and ``where`` for anything
        else: not a string or an integer, not a quantity, its text beyond
        the parser's bounds, or a value of more than :data:`MAX_DIGITS`
        digits.
    """
    try:
        amount = api_quantity.value(value)
    except exception.InvalidQuantity as err:
        raise _fail(key, '%s is not a quantity (%s)' % (where, err)) \
            from None
    if abs(amount) >= 10 ** MAX_DIGITS:
        raise _fail(key, '%s %s is beyond any device (at most %d digits)'
                    % (where, value, MAX_DIGITS))
    return amount


def _share(key: str, where: str, result: Mapping[str, Any],
           device: dra_devices.DraDevice) -> tuple[int, int]:
    """(CUs, MiB) granted to a share, from ``consumedCapacity``."""
    consumed = result.get('consumedCapacity')
    if not isinstance(consumed, Mapping):
        raise _fail(key, '%s has no consumedCapacity, but %s is a shared '
                    'device' % (where, device.name))
    for name in consumed:
        if name not in ('computeUnits', 'memory'):
            raise _fail(key, '%s.consumedCapacity names %r, which device %s '
                        'does not have' % (where, name, device.name))
    if 'computeUnits' not in consumed or 'memory' not in consumed:
        raise _fail(key, '%s.consumedCapacity must give computeUnits and '
                    'memory' % where)
    cus = quantity(key, '%s.consumedCapacity.computeUnits' % where,
                   consumed['computeUnits'])
    memory = quantity(key, '%s.consumedCapacity.memory' % where,
                      consumed['memory'])
    if cus.denominator != 1 or not 0 < cus <= \
            device.compute_units or int(cus) % device.cu_unit:
        raise _fail(key, '%s.consumedCapacity.computeUnits %s is not a '
                    'multiple of %d between %d and %d, the CUs of device %s'
                    % (where, consumed['computeUnits'], device.cu_unit,
                       device.cu_unit, device.compute_units, device.name))
    mib = math.ceil(memory / MIB) if memory > 0 else 0
    if not 0 < mib <= device.memory_mib:
        raise _fail(key, '%s.consumedCapacity.memory %s is beyond the %d '
                    'MiB of device %s' % (where, consumed['memory'],
                                          device.memory_mib, device.name))
    return int(cus), mib


def _admin_capacity(key: str, where: str, result: Mapping[str, Any]
                    ) -> None:
    """Check the ``consumedCapacity`` of an admin result (what it says is
    not used: monitoring consumes nothing).

    :raises DraClaimError: not a mapping of quantities.
    """
    consumed = result.get('consumedCapacity')
    if not isinstance(consumed, Mapping) or len(consumed) > 32:
        raise _fail(key, '%s.consumedCapacity is not a mapping of '
                    'quantities' % where)
    for name, value in consumed.items():
        quantity(key, '%s.consumedCapacity.%.40s' % (where, name), value)


def results(claim: Mapping[str, Any], uid: str, driver: str,
            plan: dra_devices.DevicePlan) -> tuple[Result, ...]:
    """The results of ``driver`` in ``claim``'s allocation.

    :param uid: the UID kubelet named.
    :raises DraClaimError: naming the claim and the field at fault.
    """
    meta = claim.get('metadata') or {}
    key = '%s/%s' % (meta.get('namespace', '?'), meta.get('name', '?'))
    if meta.get('uid') != uid:
        raise _fail(key, 'has UID %r, not %r as kubelet asked (deleted and '
                    'created again?)' % (meta.get('uid'), uid))
    allocation = (claim.get('status') or {}).get('allocation')
    if not isinstance(allocation, Mapping):
        raise _fail(key, 'is not allocated (no status.allocation)')
    raw = (allocation.get('devices') or {}).get('results')
    if not isinstance(raw, list) or len(raw) > MAX_RESULTS:
        raise _fail(key, 'status.allocation.devices.results is not a list '
                    'of at most %d results' % MAX_RESULTS)
    found = []
    drivers = set()
    seen: dict[tuple[str, str], str] = {}
    for index, result in enumerate(raw):
        where = 'status.allocation.devices.results[%d]' % index
        if not isinstance(result, Mapping):
            raise _fail(key, '%s is not an object' % where)
        drivers.add(str(result.get('driver')))
        if result.get('driver') != driver:
            continue
        request = result.get('request')
        if not isinstance(request, str) or not _REQUEST.match(request):
            raise _fail(key, '%s.request %r is not a request name (a DNS '
                        'label, or <request>/<subrequest>)' % (
                            where, request))
        if result.get('pool') != plan.node:
            raise _fail(key, '%s names pool %r; this node\'s pool is %r'
                        % (where, result.get('pool'), plan.node))
        name = result.get('device')
        device = plan.device(name) if isinstance(name, str) else None
        if device is None:
            raise _fail(key, '%s names device %r, which node %s does not '
                        'publish (not ours, or withdrawn since)' % (
                            where, name, plan.node))
        share_id = result.get('shareID') or ''
        if not isinstance(share_id, str) or (
                share_id and not _SHARE_ID.match(share_id)):
            raise _fail(key, '%s.shareID %.100r is not a UUID (hex digits '
                        'and "-", at most 64)' % (where, share_id))
        admin = result.get('adminAccess', False)
        if not isinstance(admin, bool):
            raise _fail(key, '%s.adminAccess %.40r is not true or false'
                        % (where, admin))
        if (device.name, share_id) in seen:
            raise _fail(key, '%s names %s%s again (as %s did): one result '
                        'per device%s' % (
                            where, device.name, share_id and ' share %s'
                            % share_id, seen[(device.name, share_id)],
                            ' share' if share_id else ''))
        seen[(device.name, share_id)] = 'results[%d]' % index
        cus = mib = 0
        if admin:
            # monitoring sees the whole device and holds none of it
            if result.get('consumedCapacity'):
                _admin_capacity(key, where, result)
        elif device.shared:
            cus, mib = _share(key, where, result, device)
        elif result.get('consumedCapacity'):
            raise _fail(key, '%s has consumedCapacity for the exclusive '
                        'device %s' % (where, device.name))
        found.append(Result(request=request, pool=plan.node, device=device,
                            share_id=share_id, compute_units=cus,
                            memory_mib=mib, admin=admin))
    if not found:
        raise _fail(key, 'has no result of driver %s (results name: %s)' % (
            driver, ', '.join(sorted(drivers)) or 'none'))
    return tuple(found)
