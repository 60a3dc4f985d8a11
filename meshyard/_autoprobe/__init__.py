"""A directory for PYTHONPATH: its `sitecustomize` starts meshyard's probe in every Python
process that has RANK and MESHYARD_PROBE_DIR set (`meshyard watch` puts it first on the path
of the launcher it runs, e.g. torchrun, whose workers inherit it)."""
