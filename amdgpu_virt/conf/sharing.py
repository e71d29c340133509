"""Options of the ``[sharing]`` group: how GPUs are shared by CU masks."""

from __future__ import annotations

from oslo_config import cfg

sharing_group = cfg.OptGroup(
    'sharing', title='CU and memory sharing',
    help='How one GPU is shared among pods by CU masks and memory limits.')

sharing_opts: list[cfg.Opt] = [
    cfg.StrOpt('cu_strategy', default='best-fit',
               help="""
How free compute units are chosen for a new consumer; a plugin of the
``amdgpu_virt.sharing.strategies`` namespace. Both built-in strategies
refuse a request only when too few whole allocation units are free (so
they admit the same requests); they differ in which CUs they hand out.

Possible values:

* best-fit: (default) one contiguous range taken from the smallest free
  run that holds it, so masks stay short, spread evenly over the XCDs,
  and large runs stay free; when no single run holds the request, the
  fewest pieces
* first-fit: the lowest free CU ids (HAMi's choice); masks of a busy GPU
  get scattered
* the name of any other plugin registered in that namespace

Related options:

* none
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(sharing_group)
    conf.register_opts(sharing_opts, group=sharing_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(sharing_group, sharing_opts)]
