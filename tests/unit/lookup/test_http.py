"""The HTTP clients' shared TLS context."""

from __future__ import annotations

import ssl

from nsq_ha.lookup.http import tls_context


def test_one_tls_context_verifies_servers_for_every_client() -> None:
    context = tls_context()
    assert context is tls_context()  # built once: the CA bundle is not reloaded per client
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
