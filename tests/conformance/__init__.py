"""Conformance cases run on both the real fork cluster and the in-process devcluster."""
