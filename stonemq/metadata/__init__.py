"""Cluster metadata: topics, ids, configs, journal mapping, producer-id allocation."""
