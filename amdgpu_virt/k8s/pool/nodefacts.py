"""Health and memory enforcement of each GPU, as its node registers them.

The node agent writes, per device of ``hami.io/node-amd-register``,
``health`` (false: unhealthy) and in ``custominfo`` the reason
(``healthReason``) and how the node enforces a slice's memory
(``memoryEnforcement``: ``kernel``, ``hook``, ``kernel+hook`` or
``none``). A GPU is unhealthy when any of its entries (one per compute
partition) is; its enforcement is the one its entries agree on.

A registration is node input: a value that is not one of the known
levels is reported as unknown with a warning naming the node, a reason
is cut to :data:`MAX_REASON` characters with its control and format
characters shown as escapes (``\\x1b``, ``\\u202e``: they would act on a
terminal), and a registration that cannot
be decoded reports nothing (its GPUs stay unknown), with a warning.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.pool import consumers
from amdgpu_virt.model import PciAddress
from amdgpu_virt.pool.observed import HEALTHY
from amdgpu_virt.pool.observed import NodeFacts
from amdgpu_virt.pool.observed import UNHEALTHY
from amdgpu_virt.pool.observed import UNKNOWN
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

#: the levels a node may register
LEVELS = tuple(level.value for level in enforcement.Level)
#: the longest health reason kept (characters)
MAX_REASON = 300


def _visible(char: str) -> str:
    # control and format characters (terminal escapes, bidi overrides)
    # would act on the operator's terminal: shown as escapes instead
    if unicodedata.category(char)[0] == 'C':
        code = ord(char)
        return '\\x%02x' % code if code < 0x100 else '\\u%04x' % code
    return char


def _text(value: Any) -> str:
    """Node text as it may be shown: one line, visible characters only,
    at most :data:`MAX_REASON` characters."""
    text = value if isinstance(value, str) else json.dumps(value,
                                                           default=str)
    text = ''.join(_visible(c) for c in ' '.join(
        text[:4 * MAX_REASON].split()))
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + '~'


def node_facts(node: Mapping[str, Any]
               ) -> tuple[dict[PciAddress, NodeFacts], list[str]]:
    """The facts a node object registers per GPU, and what was odd."""
    meta = node.get('metadata') or {}
    name = str(meta.get('name', ''))
    value = (meta.get('annotations') or {}).get(hami.NODE_REGISTER)
    if value is None:
        return {}, []
    try:
        infos = hami.decode_node_register(value)
    except exception.HamiProtocolError as err:
        return {}, ['node %s: %s' % (name, err)]
    warnings: list[str] = []
    health: dict[PciAddress, list[bool]] = {}
    reasons: dict[PciAddress, list[str]] = {}
    levels: dict[PciAddress, set[str]] = {}
    for info in infos:
        address = consumers.gpu_address(info)
        if address is None:
            continue
        health.setdefault(address, []).append(bool(info.health))
        reason = info.custominfo.get(hami.CUSTOMINFO_HEALTH_REASON)
        if not info.health and reason not in (None, ''):
            reasons.setdefault(address, []).append(_text(reason))
        level = info.custominfo.get(enforcement.CUSTOMINFO_KEY)
        if level is None:
            level = UNKNOWN
        elif level not in LEVELS:
            warnings.append('node %s: device %s registers %s %s, which is '
                            'not one of %s' % (
                                name, _text(info.id)[:80],
                                enforcement.CUSTOMINFO_KEY,
                                _text(level)[:80],
                                ', '.join(LEVELS)))
            level = UNKNOWN
        levels.setdefault(address, set()).add(str(level))
    facts = {}
    for address, states in health.items():
        found = levels[address]
        facts[address] = NodeFacts(
            health=HEALTHY if all(states) else UNHEALTHY,
            reason='; '.join(dict.fromkeys(reasons.get(address, ()))),
            enforcement=found.pop() if len(found) == 1 else UNKNOWN)
    return facts, warnings


def read(core_api: Any, hosts: Iterable[str] | None = None
         ) -> tuple[dict[tuple[str, PciAddress], NodeFacts], list[str]]:
    """The facts of every GPU the nodes ``hosts`` (default all) register.

    One LIST of nodes.

    :raises KubernetesError: the nodes cannot be listed.
    """
    wanted = None if hosts is None else set(hosts)
    response = k8s_client.call('LIST nodes', core_api.list_node,
                               _preload_content=False)
    result: dict[tuple[str, PciAddress], NodeFacts] = {}
    warnings: list[str] = []
    for node in json.loads(response.data).get('items') or []:
        name = str((node.get('metadata') or {}).get('name', ''))
        if wanted is not None and name not in wanted:
            continue
        facts, notes = node_facts(node)
        warnings += notes
        result.update({(name, a): f for a, f in facts.items()})
    return result, warnings
