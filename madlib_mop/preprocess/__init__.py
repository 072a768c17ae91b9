"""Packing a source table into buffers: reading (`source`), writing (`buffers`) and the
packed table's DDL and summary (`output`)."""
