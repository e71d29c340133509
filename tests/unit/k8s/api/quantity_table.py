"""What kube-apiserver returns for a quantity it was sent.

Each pair is (text sent, text the server stores and returns). The server
decodes the JSON into a ``resource.Quantity`` (``ParseQuantity``), keeps
it through etcd and encodes it again (``MarshalJSON``), which gives the
canonical text unless ``ParseQuantity`` kept the original string.

Sources, in ``k8s.io/apimachinery`` ``pkg/api/resource``:

* ``TestQuantityParseEmit``, ``TestQuantityString`` and
  ``TestQuantityParse`` of ``quantity_test.go`` (the values, and for the
  first two the text);
* for the rest (``HARNESS``), that package's parse and ``json.Marshal``
  run on the texts: the path the API server takes.
"""

from __future__ import annotations

#: asserted by apimachinery's own tests
UPSTREAM = (
    # TestQuantityParseEmit
    ('1Ki', '1Ki'), ('1Mi', '1Mi'), ('1Gi', '1Gi'), ('1024Mi', '1Gi'),
    ('1000M', '1G'), ('.001Ki', '1024m'), ('.000001Ki', '1024u'),
    ('.000000001Ki', '1024n'), ('.000000000001Ki', '2n'),
    # TestQuantityString (the alternate text and what it gives)
    ('307200Ki', '300Mi'), ('1025024Mi', '1001Gi'), ('1024Gi', '1Ti'),
    ('5000m', '5'), ('0.5', '500m'), ('0.001T', '1G'), ('1000u', '1m'),
    ('1.08', '1080m'), ('1080000000n', '1080m'), ('.001e12', '1e9'),
    ('0.001e0', '1e-3'), ('1000e-12', '1e-9'), ('00', '0'),
    ('6Ki', '6Ki'), ('1025', '1025'), ('3k', '3k'), ('80m', '80m'),
    ('1234567M', '1234567M'), ('1e3', '1e3'), ('3e3', '3e3'),
    ('300e6', '300e6'), ('80e-3', '80e-3'), ('1080n', '1080n'),
    ('1u', '1u'), ('80u', '80u'), ('-1Gi', '-1Gi'), ('-300Mi', '-300Mi'),
    ('-1080m', '-1080m'),
    # TestQuantityParse values, written canonically
    ('1e14', '100e12'), ('1e13', '10e12'), ('0.0005k', '500m'),
    ('0.00050k', '500m'), ('0.5e0', '500e-3'), ('1.2e3', '1200'),
    ('1.3E+6', '1300e3'), ('8.1k', '8100'), ('40.1T', '40100G'),
    ('2.5P', '2500T'), ('1.01E', '1010P'), ('3.001n', '4n'),
    ('1.1E-9', '2e-9'), ('0.5e-9', '1e-9'), ('0.00000012345', '124n'),
    ('9Ei', '9223372036854775807'),
    ('9223372036854775807Ki', '9223372036854775807'), ('12E', '12E'),
    ('100.035Ki', '102435840m'), ('0.5Mi', '512Ki'),
    ('0.05Gi', '53687091200m'), ('0.025Ti', '27487790694400m'),
    ('.001', '1m'), ('.0001k', '100m'),
)

#: upstream's parse and JSON encoding run on these texts
HARNESS = (
    ('24576Mi', '24Gi'), ('1536Mi', '1536Mi'), ('0.5Gi', '512Mi'),
    ('1000Mi', '1000Mi'), ('1.5Gi', '1536Mi'), ('1.5', '1500m'),
    ('0.1', '100m'), ('100m', '100m'), ('1000m', '1'), ('2000k', '2M'),
    ('1024', '1024'), ('1000', '1k'), ('1e1', '10'), ('2e2', '200'),
    ('1.5e3', '1500'), ('196608Mi', '192Gi'), ('201326592Ki', '192Gi'),
    ('65536Mi', '64Gi'), ('131072Mi', '128Gi'), ('3145728Ki', '3Gi'),
    ('0.5Ki', '512'), ('1.5Ki', '1536'), ('1.5Mi', '1536Ki'),
    ('0.75Gi', '768Mi'), ('1.5Ti', '1536Gi'), ('1.1Ki', '1126400m'),
    ('0.1Gi', '107374182400m'), ('206158430208', '206158430208'),
    ('9223372036854775808', '9223372036854775808'), ('1e30', '1e30'),
    ('100E', '100E'),
)

#: the server keeps these texts as sent (``ParseQuantity`` caches a text
#: whose mantissa it cannot shorten, kubernetes/kubernetes#138165); a
#: fresh computation gives the second text
ECHOED = (
    ('1.500', '1500m'), ('100.035k', '100035'), ('10.035M', '10035k'),
    ('7.123456M', '7123456'), ('1.', '1'), ('1.G', '1G'), ('1E3', '1e3'),
    ('1E6', '1e6'), ('1e0', '1'), ('+1Gi', '1Gi'), ('01', '1'),
    ('010', '10'),
)

#: refused by ``ParseQuantity`` (TestQuantityParse's invalid texts)
INVALID = ('1.1.M', '1+1.0M', '0.1mi', '0.1am', 'aoeu', '.5i', '1i',
           '-3.01i', '-3.01e-', ' 1', '1 ', '')

#: every (sent, returned) pair
SERVED = UPSTREAM + HARNESS + tuple((sent, sent) for sent, _c in ECHOED)
