"""The API server's admission decisions on rendered chart objects, with a
real CEL engine (``common-expression-language``).

What runs here is the CEL text the chart ships; the surrounding rules
follow the Kubernetes admission documentation (admissionregistration.k8s.io
/v1):

* webhook ``matchConditions``: all true -> the webhook is called; any false
  -> admitted without a call; an error -> ``failurePolicy`` (Fail: denied);
* ValidatingAdmissionPolicy: ``matchConstraints`` (operation, resource and
  subresource, namespace name) and ``matchConditions`` select the request;
  ``variables`` are evaluated in order (one that fails is left out, so an
  expression using it fails); a validation that is false denies with its
  ``messageExpression`` (or ``message``); one that fails follows
  ``failurePolicy``.

A kube-apiserver cannot run here (no binary), hence this stand-in for the
admission chain around the real CEL engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import cel

CALLED = 'called'
SKIPPED = 'skipped'
REJECTED = 'rejected'


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    message: str = ''
    #: the policy did not apply to the request at all
    matched: bool = True


def request(operation: str, obj: dict[str, Any] | None,
            old: dict[str, Any] | None = None, *,
            username: str = 'alice', extra: dict[str, list[str]] | None =
            None, resource: str = 'pods', subresource: str = '',
            namespace: str = 'tenant-a', kind: str = 'Pod',
            name: str | None = None) -> dict[str, Any]:
    """An AdmissionRequest (admission.k8s.io/v1) as the API server sends
    it; ``extra`` None leaves ``userInfo.extra`` out, as for users
    without extra (cluster admins)."""
    user: dict[str, Any] = {'username': username, 'uid': 'u-1',
                            'groups': ['system:authenticated']}
    if extra is not None:
        user['extra'] = extra
    meta = (obj or old or {}).get('metadata') or {}
    return {
        'uid': '705ab4f5-6393-11e8-b7cc-42010a800002',
        'kind': {'group': '', 'version': 'v1', 'kind': kind},
        'resource': {'group': '', 'version': 'v1', 'resource': resource},
        'subResource': subresource,
        'requestKind': {'group': '', 'version': 'v1', 'kind': kind},
        'name': meta.get('name', '') if name is None else name,
        'namespace': namespace,
        'operation': operation,
        'userInfo': user,
        'object': obj,
        'oldObject': old,
        'dryRun': False,
    }


def _activation(req: dict[str, Any]) -> dict[str, Any]:
    visible = {k: v for k, v in req.items()
               if k not in ('object', 'oldObject')}
    return {'object': req['object'], 'oldObject': req['oldObject'],
            'request': visible}


def _true(expression: str, activation: dict[str, Any]) -> bool:
    """Evaluate; a non-boolean result is an error, as in Kubernetes."""
    result = cel.evaluate(expression, activation)
    if not isinstance(result, bool):
        raise TypeError('expression gave %r, not a bool' % (result,))
    return result


def webhook_call(webhook: dict[str, Any], req: dict[str, Any]) -> str:
    """CALLED, SKIPPED or REJECTED (a condition failed and the policy is
    Fail) by the webhook's matchConditions."""
    activation = _activation(req)
    for condition in webhook.get('matchConditions') or []:
        try:
            if not _true(condition['expression'], activation):
                return SKIPPED
        except Exception:  # noqa: BLE001 - CEL errors of any kind
            return REJECTED if webhook.get(
                'failurePolicy', 'Fail') == 'Fail' else SKIPPED
    return CALLED


def webhook_rules_match(webhook: dict[str, Any], req: dict[str, Any]
                        ) -> bool:
    """Whether one of the webhook's ``rules`` selects the request
    (operation, and resource with its subresource)."""
    return any(_rule_matches(r, req) for r in webhook['rules'])


def _rule_matches(rule: dict[str, Any], req: dict[str, Any]) -> bool:
    resource = req['resource']['resource']
    if req['subResource']:
        resource += '/' + req['subResource']
    return (req['operation'] in rule['operations'] or
            '*' in rule['operations']) and resource in rule['resources']


def admit(policy: dict[str, Any], req: dict[str, Any]) -> Decision:
    """The decision of one ValidatingAdmissionPolicy (bound with Deny)."""
    spec = policy['spec']
    fail = spec.get('failurePolicy', 'Fail') == 'Fail'
    constraints = spec['matchConstraints']
    if not any(_rule_matches(r, req) for r in constraints['resourceRules']):
        return Decision(True, matched=False)
    selector = (constraints.get('namespaceSelector') or {}).get(
        'matchLabels') or {}
    for key, value in selector.items():
        assert key == 'kubernetes.io/metadata.name', key
        if req['namespace'] != value:
            return Decision(True, matched=False)
    activation = _activation(req)
    for condition in spec.get('matchConditions') or []:
        try:
            if not _true(condition['expression'], activation):
                return Decision(True, matched=False)
        except Exception as err:  # noqa: BLE001
            return Decision(not fail, 'matchCondition %s failed: %s'
                            % (condition['name'], err))
    variables: dict[str, Any] = {}
    activation['variables'] = variables
    for variable in spec.get('variables') or []:
        # one that fails is left out: expressions using it fail
        with contextlib.suppress(Exception):
            variables[variable['name']] = cel.evaluate(
                variable['expression'], activation)
    for validation in spec['validations']:
        try:
            ok = _true(validation['expression'], activation)
        except Exception as err:  # noqa: BLE001
            if fail:
                return Decision(False, 'expression failed: %s' % err)
            continue
        if not ok:
            message = validation.get('message', '')
            if 'messageExpression' in validation:
                # one that fails falls back to message
                with contextlib.suppress(Exception):
                    message = cel.evaluate(validation['messageExpression'],
                                           activation)
            return Decision(False, message or 'denied by %s'
                            % policy['metadata']['name'])
    return Decision(True)
