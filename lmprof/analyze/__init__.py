"""Analyze: read run directories, nsys SQLite exports and memory snapshots; never imports torch."""
