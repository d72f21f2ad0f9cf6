"""Data buffer: data sources, the buffer of partial groups, conversion into training batches."""
