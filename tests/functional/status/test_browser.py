"""The browser helper: a real Chromium loads a page, runs no network, and
the DOM and the picture it returns are what the page shows."""

from __future__ import annotations

import os
import unittest

import fixtures
import testtools

from tests.functional.fixtures import browser

PAGE = '''<!DOCTYPE html><html><head><meta charset="utf-8">
<title>t</title><style>#box { background: #123456; width: 200px;
height: 100px; }</style></head><body>
<p id="greeting">caf&eacute; &lt;b&gt;bold&lt;/b&gt;</p>
<div id="box"></div>
<svg id="chart" width="50" height="20"><rect width="50" height="20"
fill="#fe0000"><title>a &amp; b</title></rect></svg>
<template id="later"><p>not shown</p></template>
</body></html>'''


@unittest.skipUnless(browser.AVAILABLE, browser.SKIP_REASON)
class BrowserTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.page = os.path.join(self.tmp, 'page.html')
        with open(self.page, 'w', encoding='utf-8') as handle:
            handle.write(PAGE)

    def test_the_dom_after_load(self):
        dom = browser.Dom(browser.dump_dom(self.page)).root
        greeting = dom.by_id('greeting')
        self.assertEqual('café <b>bold</b>', greeting.text)
        self.assertEqual([], greeting.find_all('b'))
        (rect,) = dom.by_id('chart').find_all('rect')
        self.assertEqual('a & b', rect.text)
        self.assertEqual('#fe0000', rect.attrs['fill'])

    def test_the_picture(self):
        from PIL import Image
        out = browser.screenshot(self.page, os.path.join(self.tmp, 'p.png'),
                                 width=400, height=300)
        with Image.open(out) as image:
            colours = {c for _n, c in image.convert('RGB').getcolors(
                400 * 300 * 4)}
        self.assertIn((0x12, 0x34, 0x56), colours)
        self.assertIn((0xfe, 0x00, 0x00), colours)
