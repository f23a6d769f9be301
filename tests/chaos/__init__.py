"""The chaos suite: history checker, fault proxy, nemeses, and the runs."""
