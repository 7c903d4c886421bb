"""Benchmarks of bailing_knowledge: latency, ingestion throughput and retrieval quality."""
