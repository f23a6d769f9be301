"""Shared test configuration; the real-server fixtures come from the nsq_ha.testing plugin."""
