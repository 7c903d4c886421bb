"""Ingestion: how files become documents and documents become chunks.

`loaders` turns a file (plain text, Markdown, HTML, PDF, or a format a host registers) into a
title and a body; `chunker` cuts a body into spans that index it exactly. Both are pure and
database-free, so they can run in a worker, a management command or a test alike; storing
documents and their chunks builds on them.
"""
