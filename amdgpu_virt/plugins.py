"""Loading drivers with stevedore, failing loudly.

A misspelt driver name or a plugin that fails to import must stop start-up
with an error that names the namespace, the name and the known names, never
be skipped silently.
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
from collections.abc import Sequence
from typing import Any, NoReturn

from stevedore import driver as sd_driver
from stevedore import named as sd_named

from amdgpu_virt import exception


def available(namespace: str) -> list[str]:
    """Names registered under ``namespace`` (sorted, not loaded)."""
    return sorted({ep.name for ep in
                   importlib_metadata.entry_points(group=namespace)})


def _raise(namespace: str, name: str, reason: str) -> NoReturn:
    raise exception.DriverNotFound(
        namespace=namespace, name=name,
        known=', '.join(available(namespace)) or 'none', reason=reason)


def load_driver(namespace: str, name: str, *args: Any,
                invoke: bool = True, **kwargs: Any) -> Any:
    """Load the plugin ``name`` of ``namespace``.

    :param invoke: call the plugin with ``args``/``kwargs`` and return the
        result (an instance); otherwise return the plugin itself.
    :raises DriverNotFound: unknown name or the plugin failed to load.
    """
    def on_failure(_manager: Any, entrypoint: Any, err: BaseException) -> None:
        _raise(namespace, getattr(entrypoint, 'name', name),
               '%s: %s' % (type(err).__name__, err))

    if name not in available(namespace):
        _raise(namespace, name, 'not installed')
    manager = sd_driver.DriverManager(
        namespace=namespace, name=name, invoke_on_load=invoke,
        invoke_args=args, invoke_kwds=kwargs,
        on_load_failure_callback=on_failure)
    return manager.driver


def load_ordered(namespace: str, names: Sequence[str], *args: Any,
                 invoke: bool = True, **kwargs: Any) -> list[Any]:
    """Load ``names`` of ``namespace`` in the given order.

    :raises DriverNotFound: for the first name that is unknown or fails.
    """
    known = set(available(namespace))
    for name in names:
        if name not in known:
            _raise(namespace, name, 'not installed')

    def on_failure(_manager: Any, entrypoint: Any, err: BaseException) -> None:
        _raise(namespace, getattr(entrypoint, 'name', '?'),
               '%s: %s' % (type(err).__name__, err))

    manager = sd_named.NamedExtensionManager(
        namespace=namespace, names=list(names), name_order=True,
        invoke_on_load=invoke, invoke_args=args, invoke_kwds=kwargs,
        on_load_failure_callback=on_failure)
    return [ext.obj if invoke else ext.plugin for ext in manager]
