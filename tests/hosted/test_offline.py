"""Importing and using the hosted client reaches no network but the provider's address and reads no .env
file (see probe.py)."""

from __future__ import annotations

from tests.hosted.conftest import Sims
from tests.hosted.probe import OfflineProbe


def test_no_network_at_import_pricing_or_requests(sims: Sims, offline_probe: OfflineProbe) -> None:
    report = offline_probe.report()
    port = int(sims["fast"].url.rsplit(":", 1)[1])
    assert report["cost_map"]["source"] == "local" and report["cost_map"]["is_env_forced"] is True
    assert report["events"], "the probe saw no socket at all"
    allowed = (["connect", ["127.0.0.1", port]], ["getaddrinfo", "'127.0.0.1'"])
    assert [event for event in report["events"] if event not in allowed] == []
    assert not [name for name in report["threads"] if "cost-map" in name]  # no background fetch retrying
    assert report["dotenv"] is None  # litellm did not load the .env of the working directory
    assert report["import_s"] < 60
    print(f"import of backends.hosted.client (litellm included, under an audit hook): {report['import_s']:.2f} s")
