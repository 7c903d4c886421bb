"""Tests of ingestion: loaders, chunker, upsert."""
