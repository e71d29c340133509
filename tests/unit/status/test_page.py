"""The status page: self-contained, and every input text escaped.

The page is also opened in a real browser by the functional tests
(tests/functional/status); here its text is checked."""

from __future__ import annotations

import html.parser

import testtools

from amdgpu_virt.model import PciAddress
from amdgpu_virt.policy import running
from amdgpu_virt.pool.observed import NodeFacts
from amdgpu_virt.status import page
from tests.unit.status import fleet

EVIL = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'&'


class Tags(html.parser.HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.tags = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _page(**kw):
    made, status = fleet.status(**kw)
    return page.render(status, made.gpus, made.decisions,
                       '2026-12-06 10:00:00 UTC')


class TestPage(testtools.TestCase):

    def test_self_contained(self):
        text = _page()
        tags = Tags(text).tags
        names = {t for t, _a in tags}
        self.assertNotIn('script', names)
        self.assertNotIn('link', names)
        self.assertNotIn('img', names)
        for _tag, attrs in tags:
            for attr in ('src', 'href', 'srcset', 'action'):
                self.assertNotIn(attr, attrs)
        (policy,) = [a['content'] for t, a in tags if t == 'meta'
                     and a.get('http-equiv') == 'Content-Security-Policy']
        self.assertIn("default-src 'none'", policy)
        self.assertNotIn('url(', text)
        self.assertNotIn('@import', text)
        self.assertIn('<svg', text)
        self.assertNotIn('<?xml', text)
        self.assertTrue(text.startswith('<!DOCTYPE html>'))

    def test_every_input_text_is_escaped(self):
        facts = {('bm', PciAddress.parse(fleet.GPU1)): NodeFacts(
            'unhealthy', EVIL, 'kernel')}
        holdings = fleet.HOLDINGS + (running.Holding(
            'pod/team/' + EVIL, running.KUBERNETES, 'bm', fleet.GPU0,
            compute_units=1, memory_mib=1),)
        text = _page(facts=facts, holdings=holdings, warnings=[EVIL])
        self.assertNotIn('<script>', text)
        self.assertNotIn('<img', text)
        self.assertIn('&lt;script&gt;alert(1)&lt;/script&gt;', text)
        self.assertIn('&quot;&#x27;&amp;', text)
        names = {t for t, _a in Tags(text).tags}
        self.assertNotIn('script', names)
        self.assertNotIn('img', names)

    def test_the_same_state_gives_the_same_page(self):
        self.assertEqual(_page(), _page())
        text = _page()
        self.assertIn('Taken 2026-12-06 10:00:00 UTC; roles from '
                      'ledger.yaml; clouds asked: nova, k8s.', text)
        self.assertIn('data-host="bm" data-gpu="%s"' % fleet.GPU1, text)
        self.assertIn('<tr class="unhealthy drift"', text)
